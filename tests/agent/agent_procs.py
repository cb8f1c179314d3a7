"""Process helpers for the real-process tests: find agents through /proc, poll with deadlines."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return "gone"
    return text[text.rfind(")") + 2 :].split()[0]


def parent(pid: int) -> int:
    """The parent pid of ``pid`` (field 4 of /proc/<pid>/stat); raises OSError when it is gone."""
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    return int(text[text.rfind(")") + 2 :].split()[1])


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has exited: not alive)."""
    return _state(pid) not in ("gone", "Z", "X")


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().decode(errors="replace").split("\0")


def environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return handle.read()


def catches(pid: int, signum: int) -> bool:
    """True once the process has a handler for ``signum`` (the SigCgt mask of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as handle:
        mask = next(int(line.split()[1], 16) for line in handle if line.startswith("SigCgt:"))
    return bool(mask & (1 << (signum - 1)))


def ignores(pid: int, signum: int) -> bool:
    """True once the process ignores ``signum`` (the SigIgn mask)."""
    with open(f"/proc/{pid}/status") as handle:
        mask = next(int(line.split()[1], 16) for line in handle if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signum - 1)))


def _names_path(argv: list[str], directory: str) -> bool:
    """Whether an argument is ``directory`` or a path under it (alone or as a ``KEY=`` value): a bare substring test
    would also take ``.../test_x1`` for ``.../test_x10`` and so count another test's agents."""
    under = directory.rstrip("/") + "/"
    for arg in argv:
        value = arg.partition("=")[2] if "=" in arg else arg
        if value == directory or value.startswith(under):
            return True
    return False


def live_agents(marker: str) -> list[int]:
    """Pids of live ``provisionerd agent`` processes whose command line names ``marker`` (a directory) or a path
    under it."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            argv = cmdline(int(name))
        except OSError:
            continue
        if "agent" in argv and "--instance-ref" in argv and _names_path(argv, marker) and alive(int(name)):
            found.append(int(name))
    return sorted(found)


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds (real clock)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)
