"""Repeated log lines collapsed with a count, for a command that makes many calls in a row (``provider check``).

A plugin that breaks its schema on every listing makes the runtime log the same WARNING for every call (420-740
identical lines in one kit run, issue 33). ``collapsed_logs()`` installs, for its block, a handler on the root
logger that writes the first of each distinct line at once and counts the copies; at the end it writes one line per
repeated line with its count (``... (repeated 585 more times)``). Distinct lines past ``MAX_DISTINCT`` are written
as they come (the counts stay bounded).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

#: Distinct lines counted; later new lines are written without being counted.
MAX_DISTINCT = 1000


class CollapsingHandler(logging.Handler):
    """Writes each distinct formatted line once; ``summary()`` names those that came again, with their counts."""

    def __init__(self, stream: TextIO, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.stream = stream
        self.counts: dict[str, int] = {}
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            seen = self.counts.get(line)
            if seen is not None:
                self.counts[line] = seen + 1
                return
            if len(self.counts) < MAX_DISTINCT:
                self.counts[line] = 1
            self.stream.write(line + "\n")
            self.stream.flush()
        except Exception:  # a handler never raises into the code that logged
            self.handleError(record)

    def summary(self) -> list[str]:
        """One line per line that came more than once, in first-seen order."""
        return [f"{line} (repeated {count - 1} more times)" for line, count in self.counts.items() if count > 1]


@contextmanager
def collapsed_logs(stream: TextIO | None = None, level: int = logging.WARNING) -> Iterator[CollapsingHandler]:
    """For the block, log records of ``level`` and above go to ``stream`` (stderr) collapsed; the counts of the
    repeated ones are written at the end."""
    out = sys.stderr if stream is None else stream
    handler = CollapsingHandler(out, level)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        for line in handler.summary():
            out.write(line + "\n")
        out.flush()
