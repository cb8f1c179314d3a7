"""The Python API for tests: a running reference controller and its admin operations.

Two ways to run one, with the same handle (``addresses``, ``set_demand``, ``fail_over``, ``set_quorum``,
``status``), whose admin operations go over the wire with the admin certificate, exactly as ``refcontroller
admin`` does:

    async with open_refcontroller(certs_dir, data_dir, replicas=3, lease_ttl=5.0) as ctl:      # in this process
        await ctl.set_demand([DemandItem(...)])
        ...

    async with open_refcontroller_process(certs_dir, data_dir, replicas=3) as ctl:             # a subprocess
        ...

Both listen on ``127.0.0.1`` ports picked by the OS. The in-process handle also exposes ``server`` (the
``ControllerServer``) for white-box checks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd.domain.model import DemandItem
from refcontroller.admin import AdminClient, AdminError
from refcontroller.gate import Limits
from refcontroller.listeners import ServeConfig, serve
from refcontroller.server import ControllerServer, Timeouts


@attrs.define(eq=False)
class RefController:
    """A running reference controller: its replica addresses (index = replica) and its admin operations."""

    addresses: tuple[str, ...]
    admin: AdminClient
    server: ControllerServer | None = None  # set when it runs in this process

    async def set_demand(self, items: Sequence[DemandItem]) -> int:
        """Replace the demand; returns the snapshot ``seq`` now current."""
        return int((await self.admin.set_demand(items))["seq"])

    async def fail_over(self, target: int | None = None) -> dict[str, Any]:
        """Promote ``target`` (default: the next replica). ``{"primary": i, "term": t, "previous": j}``."""
        return await self.admin.fail_over(target)

    async def set_quorum(self, fresh: bool) -> None:
        await self.admin.set_quorum(fresh)

    async def status(self) -> dict[str, Any]:
        return await self.admin.status()


@asynccontextmanager
async def open_refcontroller(
    certs_dir: Path | str,
    data_dir: Path | str,
    *,
    replicas: int = 3,
    lease_ttl: float = 30.0,
    check_interval: float = 5.0,
    timeouts: Timeouts = Timeouts(),
    host: str = "127.0.0.1",
    new_incarnation: bool = False,
    limits: Limits = Limits(),
) -> AsyncIterator[RefController]:
    """Run the controller in this trio run (on real sockets) until the block exits."""
    config = ServeConfig(
        certs_dir=Path(certs_dir),
        data_dir=Path(data_dir),
        listen=tuple(f"{host}:0" for _ in range(replicas)),
        lease_ttl=lease_ttl,
        check_interval=check_interval,
        timeouts=timeouts,
        new_incarnation=new_incarnation,
        limits=limits,
    )
    async with trio.open_nursery() as nursery:
        running = await nursery.start(serve, config)
        try:
            yield RefController(running.addresses, AdminClient(certs_dir, running.addresses), running.server)
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_refcontroller_process(
    certs_dir: Path | str,
    data_dir: Path | str,
    *,
    replicas: int = 3,
    lease_ttl: float = 30.0,
    check_interval: float = 5.0,
    heartbeat_timeout: float = 15.0,
    host: str = "127.0.0.1",
    ready_timeout: float = 30.0,
    new_incarnation: bool = False,
    address_bound_join: Path | str | None = None,
    stderr: int | None = None,
) -> AsyncIterator[RefController]:
    """Run ``refcontroller serve`` as a subprocess (its own session) until the block exits; then SIGTERM it.

    Waits for the ``{"ready": true, ...}`` line on its stdout; stderr (the log) is inherited, or goes to the file
    descriptor ``stderr``. ``address_bound_join``: the bootstrap secret file of ``--address-bound-join``.
    """
    argv = [
        sys.executable,
        "-m",
        "refcontroller",
        "serve",
        "--certs",
        str(certs_dir),
        "--data",
        str(data_dir),
        "--listen",
        ",".join(f"{host}:0" for _ in range(replicas)),
        "--lease-ttl",
        str(lease_ttl),
        "--check-interval",
        str(check_interval),
        "--heartbeat-timeout",
        str(heartbeat_timeout),
        *(["--new-incarnation"] if new_incarnation else []),
        *(["--address-bound-join", str(address_bound_join)] if address_bound_join is not None else []),
    ]
    process = await trio.lowlevel.open_process(argv, stdout=-1, stderr=stderr, start_new_session=True)
    try:
        assert process.stdout is not None
        with trio.fail_after(ready_timeout):
            line = await _read_line(process.stdout)
        ready = json.loads(line) if line else {}
        if not ready.get("ready"):
            raise AdminError(f"refcontroller serve did not start (exit {process.poll()!r}, said {line!r})")
        addresses = tuple(ready["listen"])
        yield RefController(addresses, AdminClient(certs_dir, addresses))
    finally:
        with trio.CancelScope(shield=True):
            await _stop(process)


async def _read_line(stream: trio.abc.ReceiveStream, limit: int = 1 << 16) -> str:
    data = bytearray()
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


async def _stop(process: trio.Process, grace: float = 5.0) -> None:
    """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL it."""
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        with trio.move_on_after(grace):
            await process.wait()
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()
    if process.stdout is not None:
        await process.stdout.aclose()
