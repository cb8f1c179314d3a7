"""``refcontroller serve`` as a process, for synchronous tests that kill it, restart it on the same store and port,
or look at how it refuses a store.

``serving`` starts it in its own session and returns once it printed its ready line (one JSON document on stdout:
``ready``, ``listen``, ``incarnation``, ``term``); at the end it is killed with SIGKILL, as a crash would: nothing
in its memory survives, only what its store holds. A test that wants a clean stop sends SIGTERM itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from rigs import procs


def serve_argv(certs: Path, data: Path, *extra: str, listen: str = "127.0.0.1:0") -> list[str]:
    """The argv of ``refcontroller serve`` on ``listen`` with its store in ``data``."""
    return procs.refcontroller("serve", "--certs", certs, "--data", data, "--listen", listen, *extra)


@attrs.frozen
class Served:
    process: subprocess.Popen[bytes]
    ready: dict[str, Any]

    @property
    def address(self) -> str:
        return str(self.ready["listen"][0])


@contextmanager
def serving(certs: Path, data: Path, log: Path, *extra: str, listen: str = "127.0.0.1:0") -> Iterator[Served]:
    """``refcontroller serve`` (stderr appended to ``log``) from its ready line to a SIGKILL of its group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        process = subprocess.Popen(
            serve_argv(certs, data, *extra, listen=listen),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=sink,
            start_new_session=True,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the ready line is all it prints
        process.stdout.close()
        assert line, f"refcontroller serve exited before it was ready:\n{procs.tail(log)}"
        ready = json.loads(line)
        assert ready.get("ready") is True, line
        yield Served(process, ready)
    finally:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
