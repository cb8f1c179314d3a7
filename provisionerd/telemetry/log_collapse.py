"""Repeated log lines collapsed with a count, for a command that makes many calls in a row (``provider check``).

A plugin that breaks its schema on every listing makes the runtime log the same WARNING for every call (420-740
identical lines in one kit run, issue 33). ``collapsed_logs()`` installs, for its block, a handler on the root
logger that writes the first of each distinct line at once and counts the copies; at the end it writes one line per
repeated line with its count (``... (repeated 585 more times)``). Distinct lines past ``MAX_DISTINCT`` are written
as they come (the counts stay bounded).

The daemon's own log (``telemetry.logging_setup``) runs for months, so it cannot wait for the end: ``Collapser``
counts the copies of a line within a window (``COLLAPSE_WINDOW``) and writes the count when the window ends.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import TextIO

import attrs

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


#: The daemon's human log: an identical line within this many seconds of the first one written is counted, not
#: written; the count comes out as one line when the window has passed (``... (repeated N more times in 60 s)``).
COLLAPSE_WINDOW = 60.0


@attrs.define
class _Run:
    """One distinct line's current window: when it opened, how many copies were held back, the last of them."""

    opened: float
    held: int = 0
    last: logging.LogRecord | None = None


class Collapser:
    """Which records a long-running log writes: pure, the time passed in (the daemon's handler passes its clock).

    ``admit(key, record, now)`` says whether ``record`` is written now: the first line of a key is, and opens a
    window of ``window`` seconds; a copy within the window is held (counted). ``due(now)`` returns, once per
    window that ended with copies held, a record to write in their place: the last copy, its message ending in
    ``(repeated N more times in W s)`` and its ``repeated`` attribute set to N. At most ``limit`` keys are kept
    (the oldest windows go first, their counts written when they go), so memory stays bounded.
    """

    def __init__(self, window: float = COLLAPSE_WINDOW, limit: int = MAX_DISTINCT) -> None:
        if window <= 0:
            raise ValueError(f"collapse window must be positive, not {window!r}")
        self.window = window
        self.limit = limit
        self._runs: dict[Hashable, _Run] = {}
        self._next_due = float("inf")

    def admit(self, key: Hashable, record: logging.LogRecord, now: float) -> bool:
        run = self._runs.get(key)
        if run is not None and now - run.opened < self.window:
            run.held += 1
            run.last = record
            self._next_due = min(self._next_due, run.opened + self.window)
            return False
        self._runs.pop(key, None)  # a run that ended is due() already, or held nothing
        self._runs[key] = _Run(now)
        return True

    def due(self, now: float, *, everything: bool = False) -> list[logging.LogRecord]:
        """The summary records of the windows that ended by ``now`` (all of them with ``everything``, at close)."""
        if not everything and now < self._next_due and len(self._runs) <= self.limit:
            return []
        out: list[logging.LogRecord] = []
        self._next_due = float("inf")
        excess = len(self._runs) - self.limit
        for key in list(self._runs):
            run = self._runs[key]
            ended = everything or now - run.opened >= self.window or excess > 0
            if ended:
                excess -= 1
                del self._runs[key]
                if run.held and run.last is not None:
                    out.append(self._summary(run))
            elif run.held:
                self._next_due = min(self._next_due, run.opened + self.window)
        return out

    def _summary(self, run: _Run) -> logging.LogRecord:
        assert run.last is not None
        record = logging.makeLogRecord(run.last.__dict__)
        record.msg = f"{run.last.getMessage()} (repeated {run.held} more times in {self.window:g} s)"
        record.args = None
        record.exc_info = record.exc_text = None
        record.repeated = run.held
        return record


def collapse_key(record: logging.LogRecord) -> tuple[int, str, str]:
    """Two records are the same line when level, logger and message are (the time is not part of it)."""
    return record.levelno, record.name, record.getMessage()
