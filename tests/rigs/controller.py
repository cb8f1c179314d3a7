"""``refcontroller serve`` as a process of a test or a bench: killed, restarted on the same store and addresses,
watched refusing a store, or run beside a bench.

The process writes ``{"ready": true, "listen": [...], "term": N, "incarnation": ...}`` on stdout when it serves;
here stdout and stderr both go to its log file and the ready line is read from there, so nothing has to drain a
pipe for the process's whole life. Every form returns once that line is there:

- ``start``: through the test's ``rigs.procs.Procs`` (the test's end stops it); ``ServedController``: one store
  served at fixed loopback addresses by successive processes (``start``, ``restart``), for trio tests;
- ``serving``: for synchronous tests, a context manager; at the end the process is killed with SIGKILL, as a crash
  would: nothing in its memory survives, only what its store holds (a test that wants a clean stop sends SIGTERM);
- ``running``: for benches and session fixtures, stopped at the end as ``procs.popen`` stops a process.

``refcontroller.api.open_refcontroller_process`` stays the product's way to run one for a block with the test
defaults; this module is for what it does not cover: a restart on the same addresses, a store of another kind
(``--store etcd://...``), a bench's flags.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from refcontroller.admin import AdminClient
from rigs import procs, wait


def serve_args(certs: Path, data: Path, *extra: str, listen: str = "127.0.0.1:0") -> list[str]:
    """The arguments of ``refcontroller serve`` on ``listen`` with its store in ``data``."""
    return ["--certs", str(certs), "--data", str(data), "--listen", listen, *extra]


def serve_argv(certs: Path, data: Path, *extra: str, listen: str = "127.0.0.1:0") -> list[str]:
    """The argv of ``refcontroller serve`` on ``listen`` with its store in ``data``."""
    return procs.refcontroller("serve", *serve_args(certs, data, *extra, listen=listen))


def log_end(log: Path) -> int:
    """The size of ``log`` now (0 when there is none): where the next start's output begins."""
    try:
        return log.stat().st_size
    except OSError:
        return 0


def ready_line(log: Path, after: int = 0) -> dict[str, Any] | None:
    """The ready line in ``log`` past byte ``after`` (a log several starts append to), or ``None``."""
    try:
        with log.open("rb") as handle:
            handle.seek(after)
            lines = handle.read().decode(errors="replace").splitlines()
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


def _probe(log: Path, after: int, running: bool) -> dict[str, Any] | None:
    ready = ready_line(log, after)
    if ready is None and not running:
        raise AssertionError(f"refcontroller serve exited before it was ready:\n{procs.tail(log)}")
    return ready


async def start(
    started: procs.Procs, name: str, args: Sequence[str | Path], log: Path, limit: float = 30.0
) -> tuple[procs.Proc, str, dict[str, Any]]:
    """Start ``refcontroller serve ARGS`` through ``started`` (so the test's end stops it) and wait for its ready
    line: (the process, its first listen address, the ready line). Its output is appended to ``log``."""
    after = log_end(log)
    proc = await started.start(name, procs.refcontroller("serve", *args), log)
    ready = await wait.until_sync(f"{name} to print its ready line", lambda: _probe(log, after, proc.running()), limit)
    return proc, ready["listen"][0], ready


@contextmanager
def running(args: Sequence[str | Path], log: Path, limit: float = 30.0) -> Iterator[tuple[int, str]]:
    """``refcontroller serve ARGS`` for synchronous code (a bench, a session fixture): (its pid, its first listen
    address) once ready; stopped at the end as ``procs.popen`` stops a process. Its output is appended to ``log``."""
    after = log_end(log)
    with procs.popen(procs.refcontroller("serve", *args), log) as proc:
        ready = wait.blocking(
            "refcontroller serve to print its ready line", lambda: _probe(log, after, proc.poll() is None), limit
        )
        yield proc.pid, ready["listen"][0]


@attrs.frozen
class Served:
    process: subprocess.Popen[bytes]
    ready: dict[str, Any]

    @property
    def address(self) -> str:
        return str(self.ready["listen"][0])


@contextmanager
def serving(
    certs: Path, data: Path, log: Path, *extra: str, listen: str = "127.0.0.1:0", limit: float = 30.0
) -> Iterator[Served]:
    """``refcontroller serve`` (its output appended to ``log``) from its ready line to a SIGKILL of its group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    after = log_end(log)
    with log.open("ab") as sink:
        process = subprocess.Popen(
            serve_argv(certs, data, *extra, listen=listen),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,
        )
    try:
        ready = wait.blocking(
            "refcontroller serve to print its ready line", lambda: _probe(log, after, process.poll() is None), limit
        )
        yield Served(process, ready)
    finally:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()


@attrs.define(eq=False)
class ServedController:
    """One store (``data``) served at fixed ``addresses`` by successive ``refcontroller serve`` processes."""

    certs: Path
    data: Path
    procs: procs.Procs
    addresses: tuple[str, ...]
    args: tuple[str, ...] = ()
    proc: procs.Proc | None = None
    starts: int = 0

    @classmethod
    def at_free_ports(
        cls, certs: Path, data: Path, procs_: procs.Procs, replicas: int = 1, args: Sequence[str] = ()
    ) -> ServedController:
        addresses = tuple(f"127.0.0.1:{wait.free_port()}" for _ in range(replicas))
        return cls(certs, data, procs_, addresses, tuple(args))

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.certs, self.addresses)

    async def start(self, *extra: str, limit: float = 30.0) -> procs.Proc:
        """Start serving (its output in ``serve-N.log`` beside the store) and return once it is ready."""
        self.starts += 1
        args = serve_args(self.certs, self.data, *self.args, *extra, listen=",".join(self.addresses))
        log = self.data.parent / f"serve-{self.starts}.log"
        self.proc, _, _ = await start(self.procs, f"serve-{self.starts}", args, log, limit)
        return self.proc

    async def restart(self, *, kill: bool = False) -> procs.Proc:
        """Stop the serving process (SIGTERM, or SIGKILL with ``kill``) and start another on the same store."""
        assert self.proc is not None
        if kill:
            self.proc.kill9()
            await self.proc.wait()
        else:
            await self.proc.stop()
        return await self.start()
