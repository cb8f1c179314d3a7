"""The local provider's view of its machines: worker-agent processes of this user, found through ``/proc``.

A machine *is* an agent process. Its owner tags travel on its command line (``--label KEY=VALUE``, never secret),
together with ``--machine-id`` and the label ``provisionerd-local:data-dir=<PRO_DATA_DIR>`` that says which
provider instance started it. So the listing needs no records at all, like a cloud API finding instances by
tags: it survives a restart of the plugin or the daemon, and it shows agents whose record was never written
(a call that crashed between starting the agent and recording it).

A process is identified by ``(pid, starttime)``, ``starttime`` being field 22 of ``/proc/<pid>/stat`` (clock ticks
after boot): a pid reused by another process has another start time, so it is never mistaken for an agent we
started, and never signalled. Zombies (exited, not yet reaped) count as gone.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from itertools import pairwise

HOME_LABEL = "provisionerd-local:data-dir"
PROC = "/proc"


@dataclass(frozen=True)
class ProcStat:
    state: str  # R, S, D, Z, X, ...
    starttime: int
    ppid: int = 0

    @property
    def gone(self) -> bool:
        return self.state in ("Z", "X", "x")


@dataclass(frozen=True)
class AgentProc:
    pid: int
    starttime: int
    machine_id: str
    instance_ref: str
    tags: dict[str, str]


def proc_stat(pid: int) -> ProcStat | None:
    """State and start time of ``pid``; ``None`` when there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces and parentheses.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcStat(fields[0], int(fields[19]), int(fields[1]))
    except (IndexError, ValueError):
        return None


def is_running(pid: int, starttime: int) -> bool:
    """True when ``pid`` is alive (not a zombie) and is the very process that started at ``starttime``."""
    stat = proc_stat(pid)
    return stat is not None and not stat.gone and stat.starttime == starttime


def boot_time() -> float:
    """Epoch seconds of the last boot (``btime`` of ``/proc/stat``)."""
    with open(f"{PROC}/stat") as handle:
        for line in handle:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def launch_epoch(starttime: int) -> int:
    """The wall-clock start of a process from its ``starttime`` ticks."""
    return int(boot_time() + starttime / os.sysconf("SC_CLK_TCK"))


def parse_agent_argv(argv: list[str], data_dir: str) -> tuple[str, str, dict[str, str]] | None:
    """``(machine_id, instance_ref, tags)`` if ``argv`` is an agent this provider instance started, else ``None``."""
    if "agent" not in argv:
        return None
    machine_id = instance_ref = ""
    labels: dict[str, str] = {}
    for flag, value in pairwise(argv):
        if flag == "--machine-id":
            machine_id = value
        elif flag == "--instance-ref":
            instance_ref = value
        elif flag == "--label":
            key, sep, val = value.partition("=")
            if sep:
                labels[key] = val
    if not machine_id or labels.pop(HOME_LABEL, None) != data_dir:
        return None
    return machine_id, instance_ref, labels


def scan_agents(data_dir: str) -> dict[str, AgentProc]:
    """Every live agent of this user started by the provider whose state lives in ``data_dir``, by machine id.

    A child an agent has forked and not yet exec'd shows the agent's own command line (at import, trio runs
    ``ldconfig -p`` through ``ctypes.util.find_library``: a loaded machine makes that window long). Such a child is
    not the machine: of the processes naming one machine id, those whose parent is one of them are left out, and
    of any still left the oldest is the machine."""
    claims: dict[str, list[tuple[int, ProcStat, str, dict[str, str]]]] = {}
    uid = os.getuid()
    try:
        entries = list(os.scandir(PROC))
    except OSError:
        return {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"{entry.path}/cmdline", "rb") as handle:
                raw = handle.read(1 << 16)
        except OSError:
            continue  # exited while we looked
        parsed = parse_agent_argv(raw.decode(errors="replace").split("\0"), data_dir)
        if parsed is None:
            continue
        pid = int(entry.name)
        stat = proc_stat(pid)
        if stat is None or stat.gone:
            continue
        machine_id, instance_ref, tags = parsed
        claims.setdefault(machine_id, []).append((pid, stat, instance_ref, tags))
    found: dict[str, AgentProc] = {}
    for machine_id, claimants in claims.items():
        pids = {pid for pid, *_ in claimants}
        roots = [c for c in claimants if c[1].ppid not in pids] or claimants
        pid, stat, instance_ref, tags = min(roots, key=lambda c: (c[1].starttime, c[0]))
        found[machine_id] = AgentProc(pid, stat.starttime, machine_id, instance_ref, tags)
    return found


def signal_agent(pid: int, starttime: int, signum: int = signal.SIGTERM) -> bool:
    """Send ``signum`` to the agent's process group (it leads its own session); only if it is still that process.

    Returns False when the process is already gone (or the pid now belongs to someone else).
    """
    if not is_running(pid, starttime):
        return False
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def reap_children() -> None:
    """Collect exited children (the persistent plugin is the parent of the agents it started)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
