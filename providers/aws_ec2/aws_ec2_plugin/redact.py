"""Last line of defence against secrets in anything the plugin writes.

The plugin never formats a credential or a join token into a message on purpose; this module makes sure an
accident (an EC2 message quoting a parameter, a traceback) cannot leak one either. Every string that leaves the
process (stdout documents, stderr log lines) passes through :meth:`Redactor.scrub`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

#: Environment variables of the standard AWS chain whose values are secret (the access key id is not secret,
#: but it identifies the account's key pair, so it is scrubbed too).
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID")
_MIN_SECRET = 6  # shorter strings would scrub ordinary words; real keys and tokens are far longer
REPLACEMENT = "[REDACTED]"


class Redactor:
    """Holds the secrets known to this process and removes them from text. Thread-safe."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self.add(secrets)

    @classmethod
    def from_environment(cls) -> Redactor:
        return cls(os.environ.get(name, "") for name in SECRET_ENV)

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            self._secrets.update(s for s in secrets if isinstance(s, str) and len(s) >= _MIN_SECRET)

    def add_credentials(self, credentials: object) -> None:
        """Add what boto3 resolved (profile files, SSO, instance role): not only what the environment held."""
        if credentials is None:
            return
        frozen = credentials.get_frozen_credentials()  # type: ignore[attr-defined]
        self.add([frozen.access_key or "", frozen.secret_key or "", frozen.token or ""])

    def scrub(self, text: str, extra: Iterable[str] = ()) -> str:
        """``text`` without any known secret, nor any of ``extra`` (one call's join tokens)."""
        with self._lock:
            secrets = self._secrets | {s for s in extra if isinstance(s, str) and len(s) >= _MIN_SECRET}
        for secret in sorted(secrets, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, REPLACEMENT)
        return text
