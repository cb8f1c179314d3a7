"""``refcontroller serve`` as a process a test can kill, restart on the same store and addresses, or watch refuse
a store.

Both forms return once it printed its ready line (one JSON document on stdout: ``ready``, ``listen``,
``incarnation``, ``term``):

- ``serving``, for synchronous tests: a context manager; at the end the process is killed with SIGKILL, as a crash
  would: nothing in its memory survives, only what its store holds. A test that wants a clean stop sends SIGTERM.
- ``ServedController``, for trio tests: one store served at fixed loopback addresses by successive processes
  (``start``, ``restart``), started through ``rigs.procs.Procs`` so the test's ``open_procs`` stops the last one.

``refcontroller.api.open_refcontroller_process`` stays the product's way to run one for a block; a restart test
needs the same listen addresses across starts (the daemon and the agents reconnect to them).
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
import trio

from refcontroller.admin import AdminClient
from rigs import procs, wait


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
        """Start serving (stderr in ``serve-N.log`` beside the store) and return once it printed its ready line."""
        self.starts += 1
        argv = serve_argv(self.certs, self.data, *self.args, *extra, listen=",".join(self.addresses))
        log = self.data.parent / f"serve-{self.starts}.log"
        self.proc = proc = await self.procs.start(f"serve-{self.starts}", argv, log, stdout=subprocess.PIPE)
        stdout = proc.process.stdout
        assert stdout is not None
        line = bytearray()
        with trio.move_on_after(limit):
            while not line.endswith(b"\n"):
                chunk = await stdout.receive_some(1)
                if not chunk:
                    break
                line += chunk
        ready = json.loads(line) if line.strip() else {}
        if not ready.get("ready"):
            raise wait.WaitTimeout(f"refcontroller serve not ready within {limit:g} s: {bytes(line)!r}\n{proc.tail()}")
        return proc

    async def restart(self, *, kill: bool = False) -> procs.Proc:
        """Stop the serving process (SIGTERM, or SIGKILL with ``kill``) and start another on the same store."""
        assert self.proc is not None
        if kill:
            self.proc.kill9()
            await self.proc.wait()
        else:
            await self.proc.stop()
        return await self.start()
