"""The demo's processes: start a child in its own session with its output in a log file, stop a process group for
sure, and find processes in ``/proc`` (the local provider's agents by their labels, anything tied to a run dir).

Every child gets its own session (``start_new_session``) for two reasons: a Ctrl-C in the terminal reaches only the
demo, which then stops the pieces in order (the daemon first, so it can give its lease back), and a whole process
group can be killed at once. Agents are started by the local provider, each in a session of its own, so they are
found by their command line: ``--label provisionerd:cluster=<cluster>`` and ``--machine-id``.

A process is identified by ``(pid, starttime)`` (field 22 of ``/proc/<pid>/stat``) before it is signalled, so a pid
reused by another process is never killed. Only this user's processes are looked at.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path

import attrs
import trio

from provisionerd.domain.model import TAG_CLUSTER

PROC = Path("/proc")
#: The label the local provider puts on every agent it starts, naming its data directory (its instance).
LOCAL_HOME_LABEL = "provisionerd-local:data-dir"


@attrs.frozen
class ProcInfo:
    pid: int
    starttime: int
    argv: tuple[str, ...]


@attrs.frozen
class AgentInfo:
    """A live worker agent: its process and what its command line says about it."""

    pid: int
    starttime: int
    machine_id: str
    instance_ref: str
    labels: dict[str, str]


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, starttime)`` of ``pid``; ``None`` when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def is_alive(pid: int, starttime: int | None = None) -> bool:
    """True when ``pid`` runs (a zombie does not) and, if ``starttime`` is given, is that very process."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X", "x") and (starttime is None or stat[1] == starttime)


def user_processes(*, with_environ: bool = False) -> list[tuple[ProcInfo, bytes]]:
    """Every live process of this user (not this one), with its environment block when asked (else ``b""``)."""
    found: list[tuple[ProcInfo, bytes]] = []
    uid, me = os.getuid(), os.getpid()
    try:
        entries = list(os.scandir(PROC))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            raw = (PROC / entry.name / "cmdline").read_bytes()[: 1 << 16]
            environ = (PROC / entry.name / "environ").read_bytes()[: 1 << 18] if with_environ else b""
        except OSError:
            continue  # it exited while we looked
        stat = _stat(int(entry.name))
        if stat is None or stat[0] in ("Z", "X", "x") or not raw:
            continue
        argv = tuple(raw.decode(errors="replace").rstrip("\0").split("\0"))
        found.append((ProcInfo(int(entry.name), stat[1], argv), environ))
    return found


def parse_agent(info: ProcInfo) -> AgentInfo | None:
    """The agent ``info`` is, if it is a ``provisionerd agent`` process with a ``--machine-id``."""
    argv = info.argv
    if "agent" not in argv or "--machine-id" not in argv:
        return None
    values: dict[str, str] = {}
    labels: dict[str, str] = {}
    for flag, value in pairwise(argv):
        if flag == "--label":
            key, sep, val = value.partition("=")
            if sep:
                labels[key] = val
        elif flag in ("--machine-id", "--instance-ref"):
            values[flag] = value
    return AgentInfo(info.pid, info.starttime, values.get("--machine-id", ""), values.get("--instance-ref", ""), labels)


def cluster_agents(cluster: str) -> list[AgentInfo]:
    """Every live agent of this user carrying the owner tag ``provisionerd:cluster=<cluster>``."""
    agents = (parse_agent(info) for info, _ in user_processes())
    return [a for a in agents if a is not None and a.labels.get(TAG_CLUSTER) == cluster]


def processes_of_run(run_dir: Path) -> list[ProcInfo]:
    """Every live process of this user tied to ``run_dir``: named on its command line or in its environment (a
    provider plugin's ``PRO_DATA_DIR``). ``run_dir`` is a fresh temporary directory, so nothing else names it."""
    needle = str(run_dir)
    encoded = needle.encode()
    return [
        info
        for info, environ in user_processes(with_environ=True)
        if any(needle in arg for arg in info.argv) or encoded in environ
    ]


def signal_process(pid: int, starttime: int | None, signum: int, *, group: bool = True) -> bool:
    """Send ``signum`` to ``pid``'s process group when it leads one (else to ``pid``), if it is still that process.
    Returns False when it is gone."""
    if not is_alive(pid, starttime):
        return False
    try:
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def wait_gone(alive: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``alive()`` until it is False or ``timeout`` passes; returns True when gone."""
    with trio.move_on_after(timeout):
        while alive():  # noqa: ASYNC110 - polls processes that are not our children: no event to wait on
            await trio.sleep(interval)
        return True
    return not alive()


async def terminate_all(procs: Sequence[tuple[int, int]], grace: float) -> int:
    """SIGTERM each ``(pid, starttime)`` (its group), wait up to ``grace`` for all, SIGKILL the rest. Returns how
    many had to be killed."""
    for pid, start in procs:
        signal_process(pid, start, signal.SIGTERM)
    await wait_gone(lambda: any(is_alive(pid, start) for pid, start in procs), grace)
    killed = 0
    for pid, start in procs:
        if signal_process(pid, start, signal.SIGKILL):
            killed += 1
    return killed


@attrs.define(eq=False)
class Child:
    """A child process of the demo in its own session, its output appended to ``log``."""

    name: str
    process: trio.Process
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    async def stop(self, grace: float) -> int | None:
        """SIGTERM its process group, wait up to ``grace`` seconds, then SIGKILL the group; reap it. Returns the
        exit code (negative: killed by that signal)."""
        if self.process.returncode is None:
            _killpg(self.pid, signal.SIGTERM)
            with trio.move_on_after(grace):
                await self.process.wait()
        if self.process.returncode is None:
            _killpg(self.pid, signal.SIGKILL)
            await self.process.wait()
        _killpg(self.pid, signal.SIGKILL)  # whatever the leader left behind in its group
        return self.process.returncode


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def start_child(
    name: str, argv: Sequence[str], log: Path, *, env: dict[str, str] | None = None, stdout: int | None = None
) -> Child:
    """Start ``argv`` in its own session; stderr (and stdout unless ``stdout=subprocess.PIPE``) go to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=handle if stdout is None else stdout,
            stderr=handle,
            env=env,
            start_new_session=True,
        )
    return Child(name, process, log)


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ('' when it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
