"""``refcontroller serve`` as a process of a test or a bench, known once it prints its ready line.

The process writes ``{"ready": true, "listen": [...], "term": N, "incarnation": ...}`` on its stdout when it
serves; here stdout and stderr both go to its log file, and the ready line is read from there, so nothing has to
drain a pipe for the process's whole life. ``refcontroller.api.open_refcontroller_process`` remains the way to run
a controller on a data directory with the test defaults; this module is for what it does not cover: a store
of another kind (``--store etcd://...``), a chosen listen address, a bench's flags.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rigs import procs, wait


def ready_line(log: Path) -> dict[str, Any] | None:
    """The ready line in ``log``, or ``None`` while there is none."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith('{"ready"'):
            try:
                ready = json.loads(line)
            except ValueError:
                continue
            if ready.get("ready"):
                return dict(ready)
    return None


def _probe(log: Path, running: bool) -> dict[str, Any] | None:
    ready = ready_line(log)
    if ready is None and not running:
        raise AssertionError(f"refcontroller serve exited before it was ready; see {log}")
    return ready


async def start(
    started: procs.Procs, name: str, args: Sequence[str | Path], log: Path, limit: float = 30.0
) -> tuple[procs.Proc, str, dict[str, Any]]:
    """Start ``refcontroller serve ARGS`` through ``started`` (so the test's end stops it) and wait for its ready
    line: (the process, its first listen address, the ready line). ``log`` must be a new file: a ready line already
    in it would be taken for this start's."""
    proc = await started.start(name, procs.refcontroller("serve", *args), log)
    ready = await wait.until_sync(f"{name} to print its ready line", lambda: _probe(log, proc.running()), limit)
    return proc, ready["listen"][0], ready


@contextmanager
def serving(args: Sequence[str | Path], log: Path, limit: float = 30.0) -> Iterator[tuple[int, str]]:
    """``refcontroller serve ARGS`` for synchronous code (a bench, a session fixture): (its pid, its first listen
    address) once ready; stopped at the end as ``procs.popen`` stops a process. ``log`` must be a new file."""
    with procs.popen(procs.refcontroller("serve", *args), log) as proc:
        ready = wait.blocking(
            "refcontroller serve to print its ready line", lambda: _probe(log, proc.poll() is None), limit
        )
        yield proc.pid, ready["listen"][0]
