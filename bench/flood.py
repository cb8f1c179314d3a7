"""Connection floods against ``refcontroller serve`` at its default limits, and its memory a minute after (issue 33).

The controller runs as its own process with default flags (2000 connections, 200 unauthenticated per address, 256
MiB of receive buffers). Each flood comes from ten loopback addresses (127.0.0.2 to .11) at once: per address,
idle TCP sockets that never start TLS, and worker certificates that complete the handshake, announce a 1 MiB frame,
send 400 KiB of it and stall, so the buffer pool fills to its cap. The flood's sockets are held a few seconds,
then closed, and the controller is watched until it has let every one of them go (``admin status``: one
connection open, the bench's own, and nothing buffered). After the last flood the controller's RSS is read every 5
s for 60 s.

    python bench/flood.py [--floods 3] [--raw 100] [--frames 60] [--after 60]

Prints one line per flood (peak connections, buffered bytes, RSS) and a JSON summary: ``baseline_mb`` (after one
legitimate join and a status call, before any flood), ``peak_mb`` (VmHWM), ``after_mb`` (RSS ``--after`` seconds
after the last flood), ``ratio`` (after / baseline) and ``ok`` (ratio <= 1.2, issue 33's bound).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import trio
from realprocs import controller, rss_mb

from provisionerd.domain.model import Role
from provisionerd.pki.certs import init_certs
from provisionerd.wire.framing import HEADER, FramedStream
from provisionerd.wire.messages import Heartbeat, HeartbeatAck, Join, JoinReply
from provisionerd.wire.tls import client_ssl_context
from refcontroller.admin import AdminClient, AdminError

ADDRESSES = [f"127.0.0.{n}" for n in range(2, 12)]


async def tcp_from(source: str, address: str) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port), local_address=source)


async def legit_join(certs: Path, address: str, identity: str) -> None:
    """A provisioner from 127.0.0.1 joins and gets a heartbeat answered."""
    with trio.fail_after(30):
        tcp = await tcp_from("127.0.0.1", address)
        stream = trio.SSLStream(tcp, client_ssl_context(certs, Role.PROVISIONER), server_hostname="localhost")
        framed = FramedStream(stream)
        try:
            await framed.send(Join(role=Role.PROVISIONER, identity=identity, providers=("aws",)), 1)
            await framed.send(Heartbeat(7), 2)
            replies = {}
            while len(replies) < 2:
                envelope = await framed.receive()
                assert envelope is not None
                if envelope.corr:
                    replies[envelope.corr] = envelope.msg
            assert isinstance(replies[1], JoinReply) and replies[1].accepted, replies
            assert isinstance(replies[2], HeartbeatAck), replies
        finally:
            await trio.aclose_forcefully(stream)


async def half_frame(
    source: str, address: str, certs: Path, held: list[trio.abc.Stream], limit: trio.Semaphore
) -> None:
    try:
        async with limit:
            tcp = await tcp_from(source, address)
            held.append(tcp)
            stream = trio.SSLStream(tcp, client_ssl_context(certs, Role.WORKER), server_hostname="localhost")
            await stream.do_handshake()
            held.append(stream)
        await stream.send_all(HEADER.pack(1 << 20) + b"\0" * (400 << 10))
    except (trio.BrokenResourceError, OSError, trio.ClosedResourceError):
        pass  # dropped by a cap: what the flood is for


async def raw(source: str, address: str, n: int, held: list[trio.abc.Stream]) -> None:
    for _ in range(n):
        try:
            held.append(await tcp_from(source, address))
        except OSError:
            pass


async def gate(admin: AdminClient) -> dict | None:
    try:
        return (await admin.status())["gate"]
    except AdminError:
        return None


async def flood(certs: Path, address: str, raw_per_address: int, frames_per_address: int, pid: int) -> dict:
    held: list[trio.abc.Stream] = []
    limit = trio.Semaphore(64)
    peak_rss = 0.0
    try:
        with trio.move_on_after(60):
            async with trio.open_nursery() as nursery:
                for source in ADDRESSES:
                    nursery.start_soon(raw, source, address, raw_per_address, held)
                    for _ in range(frames_per_address):
                        nursery.start_soon(half_frame, source, address, certs, held, limit)
        for _ in range(6):  # held a while: the controller's buffers and TLS states live
            peak_rss = max(peak_rss, rss_mb(pid)[0])
            await trio.sleep(0.5)
    finally:
        for stream in held:
            await trio.aclose_forcefully(stream)
    return {"sockets": len(held), "rss_mb": peak_rss}


async def run(args: argparse.Namespace, certs: Path, pid: int, address: str) -> dict:
    admin = AdminClient(certs, [address])
    await legit_join(certs, address, "warm-up")
    await admin.status()
    await trio.sleep(3)
    baseline = rss_mb(pid)[0]
    print(f"baseline: {baseline} MiB", flush=True)
    for n in range(args.floods):
        seen = await flood(certs, address, args.raw, args.frames, pid)
        status = None
        with trio.move_on_after(60):
            while status is None or status["connections"] > 1 or status["buffered_bytes"]:
                await trio.sleep(0.5)
                status = await gate(admin)
        assert status is not None, "the controller never let the flood's connections go"
        print(
            f"flood {n + 1}: {seen['sockets']} sockets; controller peak connections {status['peak_connections']},"
            f" RSS during {seen['rss_mb']} MiB, once they were gone {rss_mb(pid)[0]} MiB;"
            f" refusals {json.dumps(status['refusals'], sort_keys=True)}",
            flush=True,
        )
        await trio.sleep(2)
    await legit_join(certs, address, "after")
    last = time.monotonic()
    samples = []
    while (elapsed := time.monotonic() - last) < args.after:
        await trio.sleep(min(5.0, args.after - elapsed))
        samples.append((round(time.monotonic() - last), rss_mb(pid)[0]))
        print(f"  {samples[-1][0]:>3} s after: {samples[-1][1]} MiB", flush=True)
    after = rss_mb(pid)[0]
    peak = rss_mb(pid)[1]
    return {
        "floods": args.floods,
        "baseline_mb": baseline,
        "peak_mb": peak,
        "after_s": args.after,
        "after_mb": after,
        "ratio": round(after / baseline, 2),
        "ok": after <= 1.2 * baseline,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floods", type=int, default=3)
    parser.add_argument("--raw", type=int, default=100, help="idle sockets per flooding address")
    parser.add_argument("--frames", type=int, default=60, help="half-sent 1 MiB frames per flooding address")
    parser.add_argument("--after", type=float, default=60.0, help="seconds after the last flood to read RSS")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        print("flood.py needs Linux (127.0.0.x sources, /proc)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pvd-flood-") as tmp:
        base = Path(tmp)
        certs = base / "certs"
        init_certs(certs, "bench")
        with controller(certs, base / "data") as (pid, address):
            summary = trio.run(run, args, certs, pid, address)
    print(json.dumps(summary, sort_keys=True))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
