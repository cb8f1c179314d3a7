"""The contract's typed error document, as a Python exception the engine raises and the transports render."""

from __future__ import annotations

#: The contract's error codes; the retryable ones are worth trying again later with the same op_id.
CODES = ("capacity_unavailable", "throttled", "quota_exceeded", "invalid_request", "auth_failed", "provider_error")
RETRYABLE = frozenset({"capacity_unavailable", "throttled"})


class Fault(Exception):
    """A refusal the plugin reports as ``{"error": {"code", "message", "retryable"}}``.

    The message is shown to operators: it never carries a join token or a credential.
    """

    def __init__(self, code: str, message: str) -> None:
        assert code in CODES, code
        super().__init__(message)
        self.code = code
        self.message = message

    def document(self) -> dict:
        """The inner error object (persistent transport: the value of ``"error"``)."""
        return {"code": self.code, "message": self.message, "retryable": self.code in RETRYABLE}
