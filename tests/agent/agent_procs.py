"""What /proc says about an agent process: alive, its command line, its environment, its signal handlers.

Finding the agents a test left behind is ``rigs.agents.live_agents``; waiting is ``rigs.wait``."""

from __future__ import annotations

from provisionerd.demo.procs import is_alive as alive  # True while it runs (a zombie has exited)

__all__ = ["alive", "catches", "cmdline", "environ", "ignores", "parent"]


def parent(pid: int) -> int:
    """The parent pid of ``pid`` (field 4 of /proc/<pid>/stat); raises OSError when it is gone."""
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    return int(text[text.rfind(")") + 2 :].split()[1])


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
