"""The last line of defence against secrets in anything a plugin writes.

A plugin never formats a credential or a join token into a message on purpose; scrubbing makes sure an accident (a
cloud's message quoting a parameter, a traceback) cannot leak one either. Every string that leaves the process
(stdout documents, stderr log lines) passes through ``Redactor.scrub`` with the call's join tokens.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

REPLACEMENT = "[REDACTED]"
#: Shorter strings are not scrubbed: they would scrub ordinary words, and real keys and tokens are far longer.
MIN_SECRET = 6


def join_tokens(doc: Any) -> list[str]:
    """The join tokens of an input document (``bootstrap[].joinToken``), so the call's output can be scrubbed."""
    boot = doc.get("bootstrap") if isinstance(doc, dict) else None
    if not isinstance(boot, list):
        return []
    return [b["joinToken"] for b in boot if isinstance(b, dict) and isinstance(b.get("joinToken"), str)]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret of at least ``MIN_SECRET`` characters replaced by ``REPLACEMENT`` (the longest
    first, so a secret that contains another is removed whole)."""
    kept = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET}
    for secret in sorted(kept, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REPLACEMENT)
    return text


class Redactor:
    """The secrets known to this process (credentials from the environment or resolved later), removed from any
    text together with one call's extra secrets. Thread-safe. A plugin subclass names the environment variables
    that hold its credentials in ``SECRET_ENV``."""

    #: Environment variables whose values are secret (``from_environment`` reads them).
    SECRET_ENV: tuple[str, ...] = ()

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self.add(secrets)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """A redactor holding the values of the ``SECRET_ENV`` variables that are set."""
        env = os.environ if environ is None else environ
        return cls(env.get(name, "") for name in cls.SECRET_ENV)

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            self._secrets.update(s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET)

    def scrub(self, text: str, extra: Iterable[str] = ()) -> str:
        """``text`` without any known secret, nor any of ``extra`` (one call's join tokens)."""
        with self._lock:
            secrets = set(self._secrets)
        secrets.update(extra)
        return scrub(text, secrets)
