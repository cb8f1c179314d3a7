"""The demo's live view: a status block redrawn in place on a terminal, plain lines otherwise.

``status_lines`` and ``plain_line`` are pure (a ``Snapshot`` in, text out). ``Progress`` writes them: on a TTY it
keeps a block of a few lines at the bottom and redraws it with ANSI cursor movement (permanent lines, such as a
step starting, are printed above it); on anything else it prints one line whenever the counts change, so a log or a
pipe gets a readable record rather than escape codes.
"""

from __future__ import annotations

import shutil
from typing import TextIO

from provisionerd.demo.observe import Snapshot

_UP_AND_CLEAR = "\x1b[{n}F\x1b[J"  # cursor to the start of the line n lines up, then clear to the end of screen


def status_lines(s: Snapshot, workers: int) -> list[str]:
    primary = "-" if s.primary is None else f"#{s.primary} {s.primary_address or '?'}"
    lines = [
        f"  [{s.elapsed:5.1f}s] {s.step}",
        f"  workers     requested {s.requested}/{workers}  joined {s.joined}  idle {s.idle}  busy {s.busy}"
        f"  returning {s.returning}  returned {s.returned}  | agents alive {s.agents}",
        f"  controller  primary {primary}  term {s.term if s.term is not None else '-'}"
        f"  worker sessions there {s.workers_on_primary}",
        f"  daemon      link {s.link} to {s.daemon_primary or '-'}  lease {s.lease}  epoch {s.epoch or '-'}"
        if s.link != "stopped"
        else "  daemon      stopped",
    ]
    if s.problem:
        lines.append(f"  (waiting: {s.problem})")
    return lines


def plain_line(s: Snapshot) -> str:
    primary = "-" if s.primary is None else f"#{s.primary}"
    return (
        f"  [{s.elapsed:5.1f}s] requested {s.requested} joined {s.joined} idle {s.idle} returning {s.returning}"
        f" returned {s.returned} | agents {s.agents} | epoch {s.epoch or '-'} ({s.lease}) | primary {primary}"
        f" term {s.term if s.term is not None else '-'} | daemon {s.link} -> "
        f"{s.daemon_primary or '-'}"
    )


def _key(s: Snapshot) -> tuple[object, ...]:
    """What makes a plain line worth printing (everything but the clock and transient problems)."""
    return (
        s.requested,
        s.joined,
        s.idle,
        s.busy,
        s.returning,
        s.returned,
        s.agents,
        s.epoch,
        s.lease,
        s.link,
        s.daemon_primary,
        s.primary,
        s.term,
        s.workers_on_primary,
    )


class Progress:
    """Writes the demo's story to ``out``: ``say`` for permanent lines, ``update`` for the live status."""

    def __init__(self, out: TextIO, *, tty: bool, workers: int) -> None:
        self.out = out
        self.tty = tty
        self.workers = workers
        self._drawn = 0  # lines of the block currently on screen
        self._last: Snapshot | None = None
        self._last_key: tuple[object, ...] | None = None

    def say(self, text: str) -> None:
        """A permanent line (printed above the live block)."""
        self._erase()
        self.out.write(text + "\n")
        self._draw()

    def update(self, snapshot: Snapshot) -> None:
        self._last = snapshot
        if self.tty:
            self._erase()
            self._draw()
        elif _key(snapshot) != self._last_key:
            self._last_key = _key(snapshot)
            self.out.write(plain_line(snapshot) + "\n")
            self.out.flush()

    def close(self) -> None:
        """Leave the last status on screen (a TTY) and stop redrawing."""
        self.tty = False
        self._drawn = 0
        self.out.flush()

    def _erase(self) -> None:
        if self.tty and self._drawn:
            self.out.write(_UP_AND_CLEAR.format(n=self._drawn))
        self._drawn = 0

    def _draw(self) -> None:
        if self.tty and self._last is not None:
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
            lines = [line[:width] for line in status_lines(self._last, self.workers)]  # no wrap: n lines up is exact
            self.out.write("\n".join(lines) + "\n")
            self._drawn = len(lines)
        self.out.flush()
