"""Processes found by what ``/proc`` shows of them, not by who started them: an agent inside a Slurm job, whatever
outlived a back end, and where a secret would be visible to ``ps`` (a command line or an environment).
"""

from __future__ import annotations

import os


def _read_state(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes (other than this one, zombies excluded) whose command line mentions ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace")
        except OSError:
            continue
        state = _read_state(name)
        if marker in argv and state not in (None, "Z", "X"):
            found.append(int(name))
    return found


def secret_in_processes(secret: str) -> list[str]:
    """Where ``secret`` appears in any process's command line or environment (``ps`` shows both), as
    ``pid/cmdline`` or ``pid/environ``: every user's processes that can be read, this one included."""
    hits = []
    needle = secret.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as f:
                    if needle in f.read():
                        hits.append(f"{name}/{part}")
            except OSError:
                continue
    return hits
