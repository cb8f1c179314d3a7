"""What a hostile frame costs the reference controller, and what another client sees meanwhile (issue 16, item 1).

Run from the repository root inside the project's environment::

    python bench/wirecost.py [--rounds 5]

It starts ``refcontroller serve`` as a subprocess on loopback, joins a provisioner (the observer) that sends a
heartbeat every 20 ms and times each round trip, lets it commit an intent so that workers have join tokens, and
then, from the *worker* certificate, sends each list-bearing message filled with empty elements
(``provisionerd.testing.hostile_frames``: 1 MiB, 250,000 zero-size structs or 131,000 empty texts) ``--rounds``
times: as the first frame of a connection for ``join``, after a worker's join for the others. For each frame it
reads the controller's CPU time (``/proc/<pid>/schedstat``, nanoseconds) before sending and after the refusal came
back (the connection's end: the controller refuses on the frame's first bytes and closes with the rest unread, so
the client usually sees a reset rather than the ``errorMsg``); the figure includes whatever else the controller did
meanwhile (the observer's heartbeats). It also decodes the issue's frame in this process with
the caps lifted, which is what the controller spent on it before (6.2 s in the issue, on another machine).

The last line is ``{"max_frame_cpu_ms": X, "max_heartbeat_rtt_ms": Y, "uncapped_decode_ms": Z, ...}``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

import trio
from realprocs import procs, serve, wait

from provisionerd.domain.model import RequestIntent, Role
from provisionerd.pki.certs import init_certs
from provisionerd.testing.hostile_frames import LIST_FIELDS, list_bomb
from provisionerd.wire import bounds, codec
from provisionerd.wire.framing import FramedStream, frame_bytes
from provisionerd.wire.messages import (
    ErrorMsg,
    FactAck,
    FactCommit,
    Heartbeat,
    HeartbeatAck,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseGrant,
    Message,
)
from provisionerd.wire.tls import client_ssl_context


def cpu_ns(pid: int) -> int:
    """Nanoseconds the process's main thread (the controller's event loop) has run on a CPU."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


class Client:
    def __init__(self, framed: FramedStream) -> None:
        self.framed = framed
        self.corr = itertools.count(1)

    async def request(self, msg: Message) -> Message:
        corr = next(self.corr)
        await self.framed.send(msg, corr)
        while True:
            envelope = await self.framed.receive()
            if envelope is None:
                raise EOFError("the controller closed the connection")
            if envelope.corr == corr:
                return envelope.msg


async def connect(certs: Path, address: str, role: Role) -> Client:
    host, port = address.rsplit(":", 1)
    stream = await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=client_ssl_context(certs, role))
    return Client(FramedStream(stream))


async def refusal_of(client: Client, body: bytes) -> str:
    """Send a raw body; the code of the ErrorMsg that answers it, or "closed" when the connection ended first (the
    controller refuses on the frame's first bytes and closes with the rest unread, so the kernel may reset the
    connection before the error is read)."""
    try:
        await client.framed.send_raw(frame_bytes(body))
    except trio.BrokenResourceError:
        return "closed"
    try:
        while (envelope := await client.framed.receive()) is not None:
            if isinstance(envelope.msg, ErrorMsg):
                return envelope.msg.code
    except trio.BrokenResourceError:
        pass
    return "closed"


async def heartbeats(observer: Client, rtts: list[float], stop: trio.Event) -> None:
    seq = 0
    while not stop.is_set():
        seq += 1
        start = time.perf_counter()
        reply = await observer.request(Heartbeat(seq))
        assert isinstance(reply, HeartbeatAck), reply
        rtts.append(time.perf_counter() - start)
        await trio.sleep(0.02)


def uncapped_decode_ms() -> float:
    """The issue's frame decoded with every cap lifted: what a decode without the bounds costs."""
    saved = dict(bounds.LIST_CAPS), bounds.DEFAULT_LIST_CAP, bounds.DEFAULT_MAX_UNITS, dict(bounds.MAX_UNITS)
    bounds.LIST_CAPS.clear()
    bounds.DEFAULT_LIST_CAP = bounds.DEFAULT_MAX_UNITS = 1 << 30
    bounds.MAX_UNITS.clear()
    try:
        body = list_bomb("adminSetDemand", ("items",))
        start = time.process_time()
        codec.decode(body)
        return (time.process_time() - start) * 1000
    finally:
        bounds.LIST_CAPS.update(saved[0])
        bounds.DEFAULT_LIST_CAP, bounds.DEFAULT_MAX_UNITS = saved[1], saved[2]
        bounds.MAX_UNITS.update(saved[3])


async def run(rounds: int, work: Path) -> dict[str, object]:
    certs, data = work / "certs", work / "data"
    init_certs(certs, "bench")
    args = ["--certs", certs, "--data", data, "--listen", "127.0.0.1:0", "--lease-ttl", "2", "--check-interval", "0.5"]
    async with procs.open_procs(grace=0) as started:
        process, address, _ = await serve.start(
            started, "controller", [*args, "--log-level", "ERROR"], work / "ctl.log"
        )
        observer = await connect(certs, address, Role.PROVISIONER)
        reply = await observer.request(Join(role=Role.PROVISIONER, identity="observer", providers=("p",)))
        assert isinstance(reply, JoinReply) and reply.accepted, reply

        async def granted() -> LeaseGrant | None:
            reply = await observer.request(LeaseAcquire("p"))
            return reply if isinstance(reply, LeaseGrant) else None

        grant = await wait.until("the lease (after the promoted controller's grace: 2.5 s)", granted, 10, interval=0.1)
        refs = [f"i-{n}" for n in range(len(LIST_FIELDS) * rounds)]
        fact = RequestIntent(
            provider="p",
            epoch=grant.epoch,
            op_id="op-1",
            template_id="t",
            count=len(refs),
            instance_refs=tuple(refs),
            token_hashes=tuple(hashlib.sha256(f"tok-{r}".encode()).hexdigest() for r in refs),
        )
        assert isinstance(await observer.request(FactCommit(fact)), FactAck)

        rtts: list[float] = []
        per_kind: dict[str, list[float]] = {}
        codes: dict[str, set[str]] = {}
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeats, observer, rtts, stop)
            await trio.sleep(0.2)
            free = iter(refs)
            for (member, path), _ in itertools.product(LIST_FIELDS, range(rounds)):
                kind = f"{member}.{'.'.join(path)}"
                body = list_bomb(member, path)
                worker = await connect(certs, address, Role.WORKER)
                if member != "join":
                    ref = next(free)
                    joined = await worker.request(
                        Join(role=Role.WORKER, identity=ref, instance_ref=ref, token=f"tok-{ref}")
                    )
                    assert isinstance(joined, JoinReply) and joined.accepted, joined
                else:
                    await worker.framed.stream.do_handshake()  # type: ignore[attr-defined]
                before = cpu_ns(process.pid)
                code = await refusal_of(worker, body)
                per_kind.setdefault(kind, []).append((cpu_ns(process.pid) - before) / 1e6)
                codes.setdefault(kind, set()).add(code)
                await trio.aclose_forcefully(worker.framed.stream)
            await trio.sleep(0.2)
            stop.set()
    for kind, cpu in per_kind.items():
        print(
            json.dumps(
                {
                    "frame": kind,
                    "refused_with": sorted(codes[kind]),
                    "cpu_ms_median": round(statistics.median(cpu), 2),
                    "cpu_ms_max": round(max(cpu), 2),
                }
            )
        )
    rtts.sort()
    return {
        "max_frame_cpu_ms": round(max(max(v) for v in per_kind.values()), 2),
        "max_heartbeat_rtt_ms": round(rtts[-1] * 1000, 2),
        "p50_heartbeat_rtt_ms": round(rtts[len(rtts) // 2] * 1000, 2),
        "heartbeats": len(rtts),
        "frames": sum(len(v) for v in per_kind.values()),
        "uncapped_decode_ms": round(uncapped_decode_ms(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wirecost-") as work:
        print(json.dumps(trio.run(run, args.rounds, Path(work))))


if __name__ == "__main__":
    main()
