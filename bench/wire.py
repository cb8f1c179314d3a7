"""The codec against trio's raw TLS stream (issue 18, item 5): frames per second over mutual TLS, in one run.

Run from the repository root inside the project's environment::

    python bench/wire.py [--frames 20000] [--batch 1] [--rounds 3]

One process, one trio loop, both ends on loopback over mutual TLS with the cluster's certificates (a controller
server context, a provisioner client): the sender writes ``--frames`` frames in batches of ``--batch`` (one write
per batch; 1 by default: a frame per write, as a request and its reply go) and the receiver reads them all.

- ``raw``: the same framed bytes, built once before the clock starts, written with ``send_all`` and read with
  ``receive_some`` until every byte is in: what trio's TLS stream costs alone;
- ``codec``: every frame encoded on the way out (``FramedStream.send_many``) and on the way in read with
  ``FramedStream.receive`` (the head peeked and checked against the allowed kinds, then the body decoded in full):
  what the daemon and the controller pay per frame.

The message is a ``ResyncPage`` of three instance facts (~1 KB, the issue's "1 KB message"). Each figure is the
best of ``--rounds``; ``encode_us``/``decode_us`` are the codec alone (CPU time, best of 9 runs). The last line is
``{"codec_frames_s": ..., "raw_frames_s": ..., "codec_vs_raw": ..., ...}`` (the issue's target: codec >= 70% of raw);
``codec_cpu_us_per_frame``, ``raw_cpu_us_per_frame`` and ``codec_vs_raw_cpu`` are the same rounds in the process's
CPU time (both ends run in it), which the load of other processes on a shared machine does not move.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from provisionerd.domain.model import CommittedFact, Epoch, InstanceFact, Role
from provisionerd.pki.certs import init_certs
from provisionerd.wire import codec
from provisionerd.wire.framing import FramedStream, frame_bytes
from provisionerd.wire.messages import ResyncPage
from provisionerd.wire.roles import ALLOWED
from provisionerd.wire.tls import client_ssl_context, server_ssl_context

EPOCH = Epoch(3, 17)


def message() -> ResyncPage:
    facts = []
    for i in range(3):
        ref = f"bench-op-{i:04d}-ref"
        token = hashlib.sha256(ref.encode()).hexdigest()
        fact = InstanceFact(
            "sim", EPOCH, "bench-op", ref, f"i-{i:017x}", "c5.large", token, f"ip-10-0-0-{i}", "10.0.0.1"
        )
        facts.append(CommittedFact(1000 + i, fact))
    return ResyncPage(0, 1, tuple(facts), (), True, 1003, 7)


def cpu_us(fn: Callable[[], object], n: int = 2000) -> float:
    best = float("inf")
    for _ in range(9):
        started = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - started) / n)
    return round(best * 1e6, 1)


async def _pair(certs: Path) -> tuple[trio.SSLStream[trio.SocketStream], trio.SSLStream[trio.SocketStream]]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    server_ctx = server_ssl_context(certs)
    accepted: list[trio.SSLStream[trio.SocketStream]] = []
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            tcp = await listeners[0].accept()
            ssl_stream = trio.SSLStream(tcp, server_ctx, server_side=True)
            await ssl_stream.do_handshake()
            accepted.append(ssl_stream)

        nursery.start_soon(accept)
        client = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", port, ssl_context=client_ssl_context(certs, Role.PROVISIONER)
        )
        await client.do_handshake()
    await listeners[0].aclose()
    return client, accepted[0]


async def timed(send: Callable[[], Awaitable[None]], receive: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for ``send`` and ``receive`` run side by side."""
    started, cpu = trio.current_time(), time.process_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await receive()
    return trio.current_time() - started, time.process_time() - cpu


async def one_round(
    certs: Path, msg: ResyncPage, batches: list[int]
) -> tuple[tuple[float, float], tuple[float, float]]:
    """((wall, CPU) seconds raw, (wall, CPU) seconds codec) for the frames of ``batches`` on a fresh mTLS
    connection."""
    client, server = await _pair(certs)
    framed_one = frame_bytes(codec.encode(msg, 5))
    raw_batches = [framed_one * n for n in batches]
    total = len(framed_one) * sum(batches)

    async def raw_send() -> None:
        for data in raw_batches:
            await client.send_all(data)

    async def raw_receive() -> None:
        got = 0
        while got < total:
            got += len(await server.receive_some(65536))

    raw = await timed(raw_send, raw_receive)
    sender, receiver = FramedStream(client), FramedStream(server)
    allowed = ALLOWED[Role.CONTROLLER]

    async def codec_send() -> None:
        for n in batches:
            await sender.send_many([(msg, 5)] * n)

    async def codec_receive() -> None:
        for _ in range(sum(batches)):
            envelope = await receiver.receive(allowed, "controller")
            assert envelope is not None and envelope.msg.page_count == 1

    coded = await timed(codec_send, codec_receive)
    await client.aclose()
    await server.aclose()
    return raw, coded


async def run(certs: Path, frames: int, batch: int, rounds: int) -> dict[str, Any]:
    msg = message()
    batches = [batch] * (frames // batch) + ([frames % batch] if frames % batch else [])
    raw_best = codec_best = raw_cpu = codec_cpu = float("inf")
    for _ in range(rounds):
        (raw, raw_c), (coded, coded_c) = await one_round(certs, msg, batches)
        raw_best, codec_best = min(raw_best, raw), min(codec_best, coded)
        raw_cpu, codec_cpu = min(raw_cpu, raw_c), min(codec_cpu, coded_c)
    body = codec.encode(msg, 5)
    return {
        "codec_frames_s": round(frames / codec_best),
        "raw_frames_s": round(frames / raw_best),
        "codec_vs_raw": round(raw_best / codec_best, 3),
        # The same from this process's CPU time (both ends run in it): what a frame costs, not what the OS gave
        # the process on a shared machine (the wall figures move with the load of other processes).
        "codec_cpu_us_per_frame": round(1e6 * codec_cpu / frames, 1),
        "raw_cpu_us_per_frame": round(1e6 * raw_cpu / frames, 1),
        "codec_vs_raw_cpu": round(raw_cpu / codec_cpu, 3),
        "frame_bytes": len(frame_bytes(body)),
        "frames": frames,
        "batch": batch,
        "encode_us": cpu_us(lambda: codec.encode(msg, 5)),
        "decode_us": cpu_us(lambda: codec.decode(body)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-wire-") as tmp:
        certs = Path(tmp) / "certs"
        init_certs(certs, "bench")
        result = trio.run(run, certs, args.frames, args.batch, args.rounds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
