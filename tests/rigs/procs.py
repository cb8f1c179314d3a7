"""Processes of a test: each in its own session with its output in a log file, and stopped for sure.

Built on the product's own ``provisionerd.demo.procs`` (``start_child``, ``Child.stop``: SIGTERM of the group,
a grace, then SIGKILL of the group). The rig adds what tests need besides: a SIGCONT first (a test may have
stopped the process with SIGSTOP), kill -9 at any moment, and ``open_procs``, which stops whatever a test started
when it ends, however it ends. Nothing outlives its test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import attrs
import trio

from provisionerd.demo.procs import Child, start_child, tail


def provisionerd(*args: str | Path) -> list[str]:
    """The argv of ``provisionerd ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "provisionerd", *map(str, args)]


def refcontroller(*args: str | Path) -> list[str]:
    """The argv of ``refcontroller ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "refcontroller", *map(str, args)]


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@attrs.define(eq=False)
class Proc:
    """A started process: ``stop`` it (or let ``open_procs`` do it), ``kill9`` it, read its ``log``."""

    child: Child

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def process(self) -> trio.Process:
        return self.child.process

    @property
    def log(self) -> Path:
        return self.child.log

    @property
    def returncode(self) -> int | None:
        return self.child.process.returncode

    def running(self) -> bool:
        return self.child.running()

    def terminate(self) -> None:
        """SIGTERM to its group, once: a second one could land after Python's finalisation restored the default
        action and kill it (exit -15, not its own code)."""
        if self.running():
            _signal_group(self.pid, signal.SIGCONT)
            _signal_group(self.pid, signal.SIGTERM)

    def kill9(self) -> None:
        """SIGKILL to its whole group, now."""
        _signal_group(self.pid, signal.SIGKILL)

    async def wait(self) -> int:
        return await self.child.process.wait()

    async def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM (once), SIGKILL of the group after ``grace``; returns the exit code."""
        if self.running():
            _signal_group(self.pid, signal.SIGCONT)
        return await self.child.stop(grace)

    def tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)


async def start(
    name: str,
    argv: Sequence[str | Path],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    stdout: int | None = None,
) -> Proc:
    """Start ``argv`` in its own session; stderr (and stdout unless ``stdout=subprocess.PIPE``) append to ``log``.
    ``env`` is added to this process's environment."""
    full = None if env is None else {**os.environ, **env}
    return Proc(await start_child(name, [str(a) for a in argv], log, env=full, stdout=stdout))


@attrs.define(eq=False)
class Procs:
    """The processes one test started (``open_procs``)."""

    started: list[Proc] = attrs.Factory(list)

    async def start(self, name: str, argv: Sequence[str | Path], log: Path, **options: object) -> Proc:
        proc = await start(name, argv, log, **options)  # type: ignore[arg-type]
        self.started.append(proc)
        return proc


@asynccontextmanager
async def open_procs(grace: float = 10.0) -> AsyncIterator[Procs]:
    """Every process started through the yielded ``Procs`` is stopped at the end (shielded: a test that failed or
    was cancelled still leaves nothing behind)."""
    procs = Procs()
    try:
        yield procs
    finally:
        with trio.CancelScope(shield=True):
            for proc in reversed(procs.started):
                await proc.stop(grace)


@contextmanager
def popen(
    argv: Sequence[str | Path], log: Path, *, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The synchronous form for session fixtures (moto, back ends): its own session, output to ``log``, and at
    the end SIGTERM, 10 s, SIGKILL of its group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_popen(proc)


def run(
    argv: Sequence[str | Path],
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end (a CLI call: ``provisionerd status``, ``refcontroller history``) and return what it
    printed; ``env`` is added to this process's environment. Never raises on a non-zero exit: the test asserts."""
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
        input=input,
        cwd=cwd,
        check=False,
    )


async def run_async(
    argv: Sequence[str | Path], *, timeout: float = 120.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``run`` from trio code: in a worker thread, so the event loop (an in-process controller) keeps serving."""
    return await trio.to_thread.run_sync(lambda: run(argv, timeout=timeout, env=env))


async def reap(proc: Proc, grace: float = 10.0) -> int:
    """Wait up to ``grace`` for the exit a ``terminate`` asked for, then SIGKILL its group; returns the exit code.
    Never a second SIGTERM (see ``Proc.terminate``): for a process told to stop by the test's own scenario."""
    with trio.move_on_after(grace):
        await proc.wait()
    if proc.running():
        proc.kill9()
    return await proc.wait()


def run_with_env(
    argv: Sequence[str | Path], *, env: Mapping[str, str], cwd: Path | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[bytes]:
    """Run a plugin's one-shot action to its end with exactly ``env`` (nothing of this process's environment, as
    the daemon runs it) and return its raw output. Never raises on a non-zero exit: the test asserts."""
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=dict(env), capture_output=True, timeout=timeout, check=False
    )


def open_pipes(argv: Sequence[str | Path], *, env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """A process a test client drives over its stdin and stdout (a persistent plugin), with exactly ``env``, in its
    own session, stderr kept for the test; ``close_pipes`` ends it."""
    return subprocess.Popen(
        [str(a) for a in argv],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def close_pipes(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> tuple[int, bytes, bytes]:
    """EOF on the stdin of an ``open_pipes`` process, then its exit (SIGKILL of its group after ``timeout``).
    Returns ``(exit code, the rest of stdout, all of stderr)``."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.close()
    try:
        rest, err = proc.stdout.read(), proc.stderr.read()
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return code, rest, err


def stop_popen(proc: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """Stop a process that synchronous code started in its own session (``start_new_session=True``): SIGTERM to its
    group, up to ``grace`` seconds, then SIGKILL of the group (whatever the leader left behind); its exit code."""
    _signal_group(proc.pid, signal.SIGCONT)
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    return proc.wait()
