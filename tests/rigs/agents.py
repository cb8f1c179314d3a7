"""``provisionerd agent`` for a test, and the agents a test left behind.

Every agent a test starts carries ``--label test-dir=<dir>`` (the test's ``tmp_path``), so ``live_agents(dir)``
finds the ones still running, however they were started (by the test, or by the local provider's plugin, which
names its data directory under ``dir``). The token is handed over on stdin, never on the command line.

A machine's boot script, as a cloud image runs it (the EC2 emulator boots nothing, the LSF example's machines are
records): ``token_file`` writes the secret in a file the agent deletes once read, ``boot`` starts the agent through
the test's ``procs.Procs`` (its output in ``agent.log`` in the machine's home), so each is stopped when the test
ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from provisionerd.demo.procs import is_alive
from rigs import procs


def agent_argv(certs: Path, controllers: Sequence[str], marker: Path, *args: str, ref: str | None = None) -> list[str]:
    """``provisionerd agent`` for ``ref`` (``--instance-ref``; none for an address-bound claim given in ``args``)
    joining ``controllers``, labelled with ``marker``."""
    instance = ("--instance-ref", ref) if ref else ()
    return _head(certs, controllers, *instance, "--label", f"test-dir={marker}", *args)


def _head(certs: Path, controllers: Sequence[str], *rest: str | Path) -> list[str]:
    """``provisionerd agent`` with the worker certificates ``certs`` joining ``controllers``, then ``rest``."""
    return procs.provisionerd("agent", "--certs", certs, "--controllers", ",".join(controllers), *rest)


@contextmanager
def agent(
    argv: Sequence[str],
    log: Path,
    token: bytes | None = None,
    *,
    close_stdin: bool = True,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` in its own session with its output appended to ``log``, write ``token`` to its stdin (and
    close it, unless ``close_stdin`` is False); at the end SIGTERM, 10 s, SIGKILL of its group. ``env`` is added to
    this process's environment."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=sink,
            stderr=sink,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
        )
    assert process.stdin is not None
    try:
        if token is not None:
            process.stdin.write(token)
            process.stdin.flush()
        if close_stdin:
            process.stdin.close()
        yield process
    finally:
        _stop(process)
        process.stdin.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        _killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    _killpg(process.pid, signal.SIGKILL)
    process.wait()


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().decode(errors="replace").split("\0")


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
            argv = _cmdline(int(name))
        except OSError:
            continue
        if "agent" in argv and "--instance-ref" in argv and _names_path(argv, marker) and is_alive(int(name)):
            found.append(int(name))
    return sorted(found)


HEARTBEAT = 0.5


def token_file(home: Path, secret: str, name: str = "join-token") -> Path:
    """``secret`` in a new 0600 file ``home/name`` (``home`` made 0700 if missing), as an image writes it."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret)
    return path


def argv(certs: Path, controllers: Sequence[str], token: Path, *who: str, heartbeat: float = HEARTBEAT) -> list[str]:
    """The agent's command line: worker certificates ``certs``, ``who`` (``--instance-ref REF``, or
    ``--address-bound --machine-id ID``), the secret read from the file ``token``."""
    return _head(certs, controllers, *who, "--token-file", token, "--heartbeat", str(heartbeat))


async def boot(
    started: procs.Procs, home: Path, certs: Path, controllers: Sequence[str], token: Path, *who: str
) -> procs.Proc:
    """Start the agent of the machine whose home is ``home`` (its log: ``home/agent.log``)."""
    return await started.start(f"agent-{home.name}", argv(certs, controllers, token, *who), home / "agent.log")


def kill_left(marker: str) -> list[int]:
    """SIGKILL every live agent ``live_agents(marker)`` finds: the machines a test's provider left running (a daemon
    that stops keeps its machines). Returns their pids."""
    left = live_agents(marker)
    for pid in left:
        _killpg(pid, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
