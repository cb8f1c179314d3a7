"""The typed error a plugin call answers with (the contract's error document)."""

from __future__ import annotations

RETRYABLE = frozenset({"capacity_unavailable", "throttled"})


class PluginError(Exception):
    """A refused call: ``code`` is one of the contract's error codes; ``message`` never carries a join token."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")

    def document(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "retryable": self.code in RETRYABLE}
