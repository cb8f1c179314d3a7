"""``refcontroller serve`` as a process a test can stop and start again on the same store and addresses.

``refcontroller.api.open_refcontroller_process`` is the product's way to run one for a block; a restart test
needs the same listen addresses across starts (the daemon and the agents reconnect to them), so this rig picks
free loopback ports once and passes them on every start. It waits for the ready line (``{"ready": true, ...}``) on
stdout; the log is ``serve-N.log`` in the data directory's parent.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from refcontroller.admin import AdminClient
from rigs import procs, wait


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
        """Start serving and return once it printed its ready line."""
        self.starts += 1
        argv = procs.refcontroller(
            "serve", "--certs", self.certs, "--data", self.data, "--listen", ",".join(self.addresses),
            *self.args, *extra,
        )  # fmt: skip
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
