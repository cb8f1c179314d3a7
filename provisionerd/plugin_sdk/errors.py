"""The contract's typed failure, as the exception a plugin raises and the transports render.

``document()`` is the error body (``error.json``): on one-shot the whole stdout is ``{"error": body}``, on the
persistent transport it is the value of the line's ``"error"`` key. The daemon decides retries from the code alone:
exactly ``capacity_unavailable`` and ``throttled`` are retryable.
"""

from __future__ import annotations

#: The contract's error codes (``defs.json#/$defs/errorCode``).
CODES = frozenset(
    {"capacity_unavailable", "throttled", "quota_exceeded", "invalid_request", "auth_failed", "provider_error"}
)
RETRYABLE = frozenset({"capacity_unavailable", "throttled"})


class PluginError(Exception):
    """A refusal with a contract error code. ``message`` is shown to operators: it must already be free of
    secrets where it is raised (the transports scrub it again). ``retry_after`` (seconds, optional) travels as the
    extension field ``retryAfter``. ``retryable`` defaults to the code's (``RETRYABLE``); a plugin may say more
    (an EC2 5xx is a retryable ``provider_error``), though the daemon decides from the code alone."""

    def __init__(
        self, code: str, message: str, retry_after: float | None = None, *, retryable: bool | None = None
    ) -> None:
        if code not in CODES:
            raise ValueError(f"{code!r} is not a contract error code (one of {sorted(CODES)})")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.retryable = code in RETRYABLE if retryable is None else retryable

    def document(self) -> dict[str, object]:
        """The error body: ``{"code", "message", "retryable"}`` (and ``retryAfter`` when set)."""
        doc: dict[str, object] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.retry_after is not None:
            doc["retryAfter"] = self.retry_after  # ext
        return doc


def internal_error(exc: BaseException) -> PluginError:
    """What a bug answers: ``provider_error`` naming the exception's type, never its text (which may quote an
    input, and an input may hold join tokens)."""
    return PluginError("provider_error", f"internal error: {type(exc).__name__}")
