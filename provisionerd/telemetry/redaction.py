"""Redaction of secrets from any text the daemon quotes or logs: one ``Redactor`` holding the configured credential
values and a call's join tokens, replacing each (as is, JSON-escaped, and escaped twice) by ``***``.

Its own module, below the provider runtime that fills it: every process that logs (the agent too) uses it without
importing the plugin contract's schemas.
"""

from __future__ import annotations

import json
from collections.abc import Collection

import attrs

REDACTED = "***"


@attrs.frozen
class Redactor:
    """Replaces every secret (and its JSON-escaped form) in a text by ``***``. Values shorter than 4 characters
    are not redacted: they are not credentials, and blanking every "a" would make errors unreadable."""

    secrets: frozenset[str] = frozenset()

    def including(self, more: Collection[str]) -> Redactor:
        if not more:  # the common case (no join tokens in the input), on every call
            return self
        extra = {s for s in more if len(s) >= 4} - self.secrets
        return Redactor(self.secrets | extra) if extra else self

    @property
    def reach(self) -> int:
        """The length of the longest text this replaces (a secret or an escaped form of it): a cut through
        unredacted text must keep at least this much to leave no fragment (``StderrTail``)."""
        return max((len(form) for s in self.secrets for form in _forms(s)), default=0)

    def __call__(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):  # longest first: one may contain another
            for form in _forms(secret):
                if form in text:
                    text = text.replace(form, REDACTED)
        return text


def _escaped(text: str) -> str:
    return json.dumps(text)[1:-1]


def _forms(secret: str) -> tuple[str, ...]:
    """A secret as it may appear in a line: as is, JSON-escaped (a JSON document or log line), and escaped twice
    (a ``key="value"`` text field, escaped like JSON, inside a JSON log line's message), longest first."""
    once = _escaped(secret)
    return tuple(dict.fromkeys((_escaped(once), once, secret)))
