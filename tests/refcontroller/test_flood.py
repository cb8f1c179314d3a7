"""A bounded flood against ``refcontroller serve`` on loopback (real clock, a subprocess, about 10 s): the
connection and buffer caps hold, legitimate clients keep joining, every refusal is counted, and the memory comes
back once the flood is gone.

Loopback has a whole /8, so the flood comes from 127.0.0.2 and up while the legitimate clients use 127.0.0.1: the
per-address cap stops each flooding address, the total cap stops them all together.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from rc_client import on_real_clock
from rigs import procs, wait

from provisionerd.domain.model import Role
from provisionerd.wire.framing import HEADER, FramedStream
from provisionerd.wire.messages import Heartbeat, HeartbeatAck, Join, JoinReply
from provisionerd.wire.tls import client_ssl_context
from refcontroller.admin import AdminClient, AdminError

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.x sources and /proc"),
]

MAX_CONNECTIONS, PER_ADDRESS, BUFFERED = 120, 30, 8 << 20
ARGS = [
    "--max-connections", str(MAX_CONNECTIONS), "--max-connections-per-address", str(PER_ADDRESS),
    "--max-buffered-bytes", str(BUFFERED), "--handshake-timeout", "2", "--join-timeout", "2",
]  # fmt: skip


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


async def gate_status(admin: AdminClient) -> dict | None:
    """The controller's gate status, or None while it refuses new connections (the total cap)."""
    try:
        return (await admin.status())["gate"]
    except AdminError:
        return None


async def tcp_from(source: str, address: str) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port), local_address=source)


async def tls_from(source: str, address: str, certs: Path, role: Role) -> trio.SSLStream[trio.SocketStream]:
    stream = trio.SSLStream(
        await tcp_from(source, address), client_ssl_context(certs, role), server_hostname="localhost"
    )
    await stream.do_handshake()
    return stream


async def legit_join(certs: Path, address: str, identity: str) -> None:
    """A provisioner from 127.0.0.1 joins and gets a heartbeat answered, within 5 s."""
    with trio.fail_after(5):
        stream = await tls_from("127.0.0.1", address, certs, Role.PROVISIONER)
        framed = FramedStream(stream)
        try:
            await framed.send(Join(role=Role.PROVISIONER, identity=identity, providers=("aws",)), 1)
            await framed.send(Heartbeat(7), 2)
            replies = {}
            while len(replies) < 2:
                envelope = await framed.receive()
                assert envelope is not None
                if envelope.corr:  # not a push (a demand snapshot follows the join)
                    replies[envelope.corr] = envelope.msg
            assert isinstance(replies[1], JoinReply) and replies[1].accepted, replies
            assert isinstance(replies[2], HeartbeatAck), replies
        finally:
            await trio.aclose_forcefully(stream)


async def half_frame(source: str, address: str, certs: Path, held: list[trio.abc.Stream]) -> None:
    """A worker certificate that announces a 1 MiB frame, sends 400 KiB of it, and stalls."""
    try:
        stream = await tls_from(source, address, certs, Role.WORKER)
        held.append(stream)
        await stream.send_all(HEADER.pack(1 << 20) + b"\0" * (400 << 10))
    except (trio.BrokenResourceError, OSError):
        pass  # refused (a cap) or dropped: what the test counts on the controller's side


async def raw_connections(source: str, address: str, n: int, held: list[trio.abc.Stream]) -> None:
    for _ in range(n):
        try:
            held.append(await tcp_from(source, address))
        except OSError:
            pass


@asynccontextmanager
async def closing_all(held: list[trio.abc.Stream]) -> AsyncIterator[None]:
    """The flood's streams closed at the end, however the test ends."""
    try:
        yield
    finally:
        for stream in held:
            await trio.aclose_forcefully(stream)


@on_real_clock
async def test_flood_of_connections_and_half_sent_frames_is_capped_and_its_memory_returns(
    certs: Path, tmp_path: Path
) -> None:
    argv = procs.refcontroller("serve", "--certs", certs, "--data", tmp_path, "--listen", "127.0.0.1:0")
    argv += ["--log-level", "ERROR", *ARGS]
    held: list[trio.abc.Stream] = []
    async with procs.open_procs() as started, closing_all(held):
        served = await started.start("refcontroller", argv, tmp_path / "serve.log", stdout=subprocess.PIPE)
        process = served.process
        assert process.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1)
        address = json.loads(line)["listen"][0]
        admin = AdminClient(certs, [address])
        # serve re-executed itself on glibc's malloc (refcontroller.allocator): freed memory can go back
        assert "PYTHONMALLOC=malloc" in environ(process.pid)
        await legit_join(certs, address, "warm-up")
        await admin.status()
        start_rss = rss_bytes(process.pid)

        # Phase 1: per-address caps and the buffer cap, while a legitimate client joins.
        with trio.fail_after(10):
            await raw_connections("127.0.0.2", address, 2 * PER_ADDRESS, held)
            async with trio.open_nursery() as nursery:
                for _ in range(PER_ADDRESS):
                    nursery.start_soon(half_frame, "127.0.0.3", address, certs, held)
            await legit_join(certs, address, "during-1")
            gate = (await admin.status())["gate"]
            peak_rss = rss_bytes(process.pid)
            assert gate["connections"] <= 2 * PER_ADDRESS + 1  # the admin's own connection
            assert gate["buffered_bytes"] <= BUFFERED
            assert gate["refusals"]["connections_per_address"]["-"] == PER_ADDRESS

            # Phase 2: the total cap, across five more addresses. (While it is reached, nobody gets in: the
            # status is read once the flood's connections have timed out.)
            for n in range(4, 9):
                await raw_connections(f"127.0.0.{n}", address, PER_ADDRESS, held)
            peak_rss = max(peak_rss, rss_bytes(process.pid))

        # The flood's connections time out on the controller's side (handshake and join timeouts, 2 s).
        async def settled() -> dict | None:
            gate = await gate_status(admin)
            return gate if gate is not None and gate["connections"] <= 1 else None

        gate = await wait.until("the flood's connections timed out on the controller's side", settled, 8, 0.2)
        assert gate["buffered_bytes"] == 0
        assert gate["peak_connections"] == MAX_CONNECTIONS
        assert gate["refusals"]["connections_total"]["-"] >= 1
        assert gate["refusals"]["handshake"]["-"] >= PER_ADDRESS
        # Each half-sent frame ended in one of two ways: over the buffer cap, or still waiting at the join timeout.
        ended = {r: gate["refusals"].get(r, {}).get("worker", 0) for r in ("buffers_exhausted", "join_timeout")}
        assert sum(ended.values()) == PER_ADDRESS and ended["buffers_exhausted"] >= 1, gate
        await legit_join(certs, address, "after")
        bound = start_rss * 1.2  # the controller hands freed memory back every 2 s (gate.return_memory)
        await wait.until_sync("the controller's memory handed back", lambda: rss_bytes(process.pid) <= bound, 4.5, 0.25)
        end_rss = rss_bytes(process.pid)
        print(f"controller RSS: start {start_rss >> 20} MiB, peak {peak_rss >> 20} MiB, after {end_rss >> 20} MiB")
        assert end_rss <= start_rss * 1.2, (start_rss, peak_rss, end_rss)


@on_real_clock
async def test_idle_sockets_from_an_address_do_not_lock_out_an_authenticated_peer_behind_it(
    certs: Path, tmp_path: Path
) -> None:
    """Issue 33: 197 idle sockets from one address locked it out for the handshake timeout. Now the unauthenticated
    budget makes room by closing its oldest connection, and connections past a valid certificate have their own
    budget: a provisioner behind the flooding address joins at once, beside as many authenticated idle peers."""
    argv = procs.refcontroller("serve", "--certs", certs, "--data", tmp_path, "--listen", "127.0.0.1:0")
    argv += ["--log-level", "ERROR", "--max-connections-per-address", str(PER_ADDRESS), "--handshake-timeout", "30"]
    argv += ["--join-timeout", "30"]
    held: list[trio.abc.Stream] = []
    async with procs.open_procs() as started, closing_all(held):
        served = await started.start("refcontroller", argv, tmp_path / "serve.log", stdout=subprocess.PIPE)
        assert served.process.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                line += await served.process.stdout.receive_some(1)
        address = json.loads(line)["listen"][0]
        admin = AdminClient(certs, [address])
        with trio.fail_after(20):
            # Authenticated idle peers from the address (workers past their handshake, no Join yet)...
            for _ in range(PER_ADDRESS):
                held.append(await tls_from("127.0.0.1", address, certs, Role.WORKER))
            # ...then three budgets' worth of idle sockets that never start TLS.
            await raw_connections("127.0.0.1", address, 3 * PER_ADDRESS, held)
            await legit_join(certs, address, "behind-the-flood")
        gate = (await admin.status())["gate"]
        assert gate["authenticated"] >= PER_ADDRESS, gate
        assert gate["refusals"]["connections_per_address"]["-"] >= 2 * PER_ADDRESS, gate
        assert "handshake" not in gate["refusals"], gate  # nobody waited out the 30 s handshake timeout
