"""stderr logging for a plugin: the daemon keeps a plugin's stderr (redacted, then cut) as its log.

Every formatted line passes through the redactor, so a secret in an exception or a third-party library's message
never reaches the log. Per-call events are one JSON object a line (``calls.run_action``).
"""

from __future__ import annotations

import logging
import sys

from provisionerd.plugin_sdk.redact import Redactor


class _RedactingFormatter(logging.Formatter):
    def __init__(self, prefix: str, redactor: Redactor) -> None:
        super().__init__(f"{prefix} %(levelname)s %(message)s")
        self._redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self._redactor.scrub(super().format(record))


def setup_logging(prefix: str, redactor: Redactor | None = None, level: int = logging.INFO) -> Redactor:
    """Send the root logger to stderr as ``<prefix> LEVEL message``, scrubbed by ``redactor`` (a new empty one by
    default). Returns the redactor, so the transports scrub with the same secrets."""
    redactor = redactor or Redactor()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter(prefix, redactor))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return redactor
