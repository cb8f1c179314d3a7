"""The plugin's one error type: a contract error code, a message free of secrets, and whether a retry may help.

The daemon decides retries from the code alone: only ``capacity_unavailable`` and ``throttled`` are retried, so
every transient API failure (unreachable, 429, 5xx) is ``throttled``. ``retry_after`` (seconds, from the server's
``Retry-After``) travels as the extension field ``retryAfter`` and in the message.
"""

from __future__ import annotations

RETRYABLE = frozenset({"capacity_unavailable", "throttled"})


class PluginError(Exception):
    """A failure with a contract error code. ``message`` must already be free of secrets where it is raised."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE

    def document(self) -> dict[str, object]:
        doc: dict[str, object] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.retry_after is not None:
            doc["retryAfter"] = self.retry_after  # ext
        return doc
