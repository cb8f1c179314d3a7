"""What one resync costs as history grows (issue 18, items 1-3): 1,000 live machines and K ended lifecycles.

Run from the repository root inside the project's environment::

    python bench/history.py [--sizes 1000,10000,100000,1000000] [--no-live] [--limit 90]

For each size it makes a store directly through the store API (``FactStore.append_many``, one transaction):
1,000 live machines (100 request intents of 10, each with its 10 instance facts) behind ``K`` ended lifecycles
(each one a request intent of 1, its instance fact, a return intent and its ``Returned``: 4 facts). It starts the
real reference controller (``python -m refcontroller serve``, default flags) on that store and, in another process,
the daemon's controller session (``provisionerd.controller.session.ControllerSession`` with the default
``[controller]`` settings: 2 s heartbeats, 6 s heartbeat timeout) over mutual TLS, connected as the daemon
connects (``controller.connect.open_controller_stream``: its socket options and handshake, without the certificate's
cluster check), which joins, resyncs and builds its view exactly as the daemon does. ``live_100k``: 100,000 live
machines (10,000 intents of 10), no history.

Each row (measured in the daemon process):

- ``resync_s``: from the join until the resynced view is in place (the link ``up``); ``None`` when the link did not
  come up within ``--limit`` seconds (``drops`` says how often it broke meanwhile);
- ``bytes``: bytes received on the link in that time;
- ``daemon_cpu_s``: the daemon process's CPU time in that time;
- ``hb_gap_max_ms``: the longest heartbeat round trip on the resyncing link: a probe sends a heartbeat on the link
  every 20 ms from the join until 1 s after the view is in place; the controller's ack waits behind whatever holds
  its read loop, and its handling waits behind whatever holds the daemon's;
- ``daemon_rss_mb``: the daemon process's peak RSS;
- ``loop_max_ms``: the longest single task step on the daemon's event loop in that time (a trio instrument), and
  ``loop_steps`` the four longest ``[ms, task]``, ``loop_max_cpu_ms`` the longest in CPU time of the loop's thread
  (what a step cost, without the time the process waited for a core on a loaded machine); ``hb_gap_at_s``: the
  three longest heartbeat round trips with when they were sent (seconds after the join), which tells the
  controller's stretches from the daemon's;
- ``incremental_s`` (when the controller offers it): after the link is up the daemon drops it and rejoins 60 s of
  nothing later (the break is simulated by dropping and rejoining at once: the controller's log is the same), and
  this is the second resync's time.

The last line is ``{"history": {"1000": {...}, ...}, "live_100k": {...}}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import realprocs
import trio
from realprocs import procs, token_hash

from provisionerd.controller.connect import open_controller_stream
from provisionerd.controller.link import Link
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import LinkState, SessionSettings
from provisionerd.domain.model import Epoch, Fact, InstanceFact, RequestIntent, Returned, ReturnIntent, Role
from provisionerd.pki.certs import init_certs
from provisionerd.telemetry.events import EventLog
from provisionerd.wire.messages import Heartbeat, HeartbeatAck, Message
from provisionerd.wire.tls import client_ssl_context

PROVIDER = "sim"
IDENTITY = "bench"
HOLDER = f"{IDENTITY}#fill"
EPOCH = Epoch(1, 1)
PROBE_EVERY = 0.02
PROBE_CORR = 1 << 40


def history_facts(ended: int, live: int) -> Iterator[Fact]:
    """``ended`` whole lifecycles (intent, instance, return intent, returned), then ``live`` machines in tens."""
    for i in range(ended):
        op, ref, machine = f"h{i}", f"h{i}-r", f"h{i}-m"
        token = token_hash(ref)
        yield RequestIntent(PROVIDER, EPOCH, op, "t", 1, (ref,), (token,), "d")
        yield InstanceFact(PROVIDER, EPOCH, op, ref, machine, "t", token, f"host-{machine}", "10.0.0.1", 1e9)
        yield ReturnIntent(PROVIDER, EPOCH, f"hr{i}", (machine,), "idle")
        yield Returned(PROVIDER, EPOCH, f"hr{i}", (machine,))
    for j in range(0, live, 10):
        op = f"l{j}"
        refs = tuple(f"{op}-r{k}" for k in range(min(10, live - j)))
        yield RequestIntent(PROVIDER, EPOCH, op, "t", len(refs), refs, tuple(token_hash(r) for r in refs), "d")
        for ref in refs:
            yield InstanceFact(
                PROVIDER, EPOCH, op, ref, f"{ref}-m", "t", token_hash(ref), f"host-{ref}", "10.0.0.2", 1e9
            )


def fill(data: Path, ended: int, live: int) -> tuple[int, float]:
    """Make the store; (facts, seconds)."""
    return realprocs.fill(data, history_facts(ended, live), HOLDER)


# --- the daemon side (a child process) --------------------------------------------------------------------------


class _Counting(trio.abc.Stream):
    def __init__(self, inner: trio.abc.Stream, counter: list[int]) -> None:
        self._inner, self._counter = inner, counter

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        self._counter[0] += len(data)
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class _LongestStep(trio.abc.Instrument):
    """The longest stretch one task held the daemon's event loop (a task step), and which task."""

    def __init__(self) -> None:
        self.started = self.started_cpu = 0.0
        self.longest: list[tuple[float, str]] = []
        self.longest_cpu = 0.0  # the same in CPU time of the loop's thread: what the step itself cost, not preemption

    def reset(self) -> None:
        self.longest, self.longest_cpu = [], 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.started, self.started_cpu = time.perf_counter(), time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        took = time.perf_counter() - self.started
        self.longest_cpu = max(self.longest_cpu, time.thread_time() - self.started_cpu)
        if took > 0.005:
            self.longest.append((took, task.name.rsplit(".", 1)[-1]))


async def daemon_child(address: str, certs: Path, limit: float, rejoin: bool) -> dict[str, Any]:
    steps = _LongestStep()
    trio.lowlevel.add_instrument(steps)
    received = [0]
    ctx = client_ssl_context(certs, Role.PROVISIONER)

    async def connect(_: str) -> trio.abc.Stream:  # the daemon's own (connect.tls_connector) but for the role check
        stream = await open_controller_stream(address, ctx)
        return _Counting(stream, received)

    probes: dict[int, float] = {}
    rtts: list[float] = []
    worst: list[tuple[float, float]] = []  # (rtt, sent) of every probe answered
    original_route = Link._route

    def route(self: Link, msg: Message, corr: int) -> None:
        if isinstance(msg, HeartbeatAck) and corr in probes:
            sent = probes.pop(corr)
            rtts.append(trio.current_time() - sent)
            worst.append((rtts[-1], sent))
        original_route(self, msg, corr)

    Link._route = route  # type: ignore[method-assign]
    settings = SessionSettings(identity=IDENTITY, providers=(PROVIDER,), addresses=(address,))
    session = ControllerSession(settings, connect, EventLog(), random.Random(1))
    result: dict[str, Any] = {}
    probe_corr = itertools.count(PROBE_CORR)

    async def probe(link: Link, until: trio.Event) -> None:
        while not until.is_set() and not link.reason:
            corr = next(probe_corr)
            probes[corr] = trio.current_time()
            await link._outbox_send.send((Heartbeat(0), corr))
            await trio.sleep(PROBE_EVERY)

    async def one_resync(nursery: trio.Nursery, deadline: float, previous: Link | None = None) -> dict[str, Any]:
        drops, link, t0, cpu0, bytes0 = 0, None, 0.0, 0.0, 0
        done = trio.Event()
        with trio.move_on_at(deadline):
            while True:
                current = session._link
                if current is not None and current is not link and current is not previous:
                    if link is not None:
                        drops += 1
                    link, t0, cpu0, bytes0 = current, trio.current_time(), time.process_time(), received[0]
                    probes.clear()
                    rtts.clear()
                    worst.clear()
                    steps.reset()
                    nursery.start_soon(probe, link, done)
                if session.state is LinkState.UP and link is not None and session._link is link:
                    break
                await session.changed()
        up = session.state is LinkState.UP
        t1, cpu1, bytes1 = trio.current_time(), time.process_time(), received[0]
        if up:
            await trio.sleep(1.0)
        done.set()
        now = trio.current_time()
        gaps = rtts + [now - sent for sent in probes.values()]
        return {
            "up": up,
            "resync_s": round(t1 - t0, 3) if up else None,
            "bytes": bytes1 - bytes0,
            "daemon_cpu_s": round(cpu1 - cpu0, 3),
            "hb_gap_max_ms": round(1000 * max(gaps, default=0.0), 1),
            "daemon_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "drops": drops,
            "hb_gap_at_s": [[round(1000 * r, 1), round(s - t0, 3)] for r, s in sorted(worst, reverse=True)[:3]],
            "loop_max_ms": round(1000 * max((t for t, _ in steps.longest), default=0.0), 1),
            "loop_max_cpu_ms": round(1000 * steps.longest_cpu, 1),
            "loop_steps": sorted(((round(1000 * t, 1), n) for t, n in steps.longest), reverse=True)[:4],
            "machines": None if session.view is None else len(session.view.facts.machines),
        }

    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        result = await one_resync(nursery, trio.current_time() + limit)
        if rejoin and result["up"] and session._link is not None:
            first = session._link
            first.break_("bench: a break")
            again = await one_resync(nursery, trio.current_time() + limit, first)
            result["incremental_s"] = again["resync_s"]
            result["incremental_bytes"] = again["bytes"]
        nursery.cancel_scope.cancel()
    return result


# --- the driver -------------------------------------------------------------------------------------------------


def run_row(ended: int, live: int, limit: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        root = Path(tmp)
        certs = root / "certs"
        init_certs(certs, "bench")
        facts, fill_s = fill(root / "data", ended, live)
        with realprocs.controller(certs, root / "data") as (_, address):
            argv = [sys.executable, __file__, "--child", address, "--certs", certs, "--limit", str(limit)]
            child = procs.run(argv, timeout=limit + 600)
            lines = child.stdout.strip().splitlines()
            if child.returncode != 0 or not lines:
                raise RuntimeError(f"daemon process failed: {child.stderr[-2000:]}")
            row: dict[str, Any] = json.loads(lines[-1])
        row.update(store_facts=facts, fill_s=round(fill_s, 1))
        return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="ended lifecycles per row")
    parser.add_argument("--no-live", action="store_true", help="skip the live_100k row")
    parser.add_argument("--limit", type=float, default=90.0, help="seconds to wait for the link to come up")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--certs", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(trio.run(daemon_child, args.child, args.certs, args.limit, True)), flush=True)
        return 0
    out: dict[str, Any] = {"history": {}}
    for size in (int(s) for s in args.sizes.split(",") if s):
        row = run_row(size, 1000, args.limit)
        out["history"][str(size)] = row
        print(json.dumps({"history": size, **row}), file=sys.stderr, flush=True)
    if not args.no_live:
        out["live_100k"] = run_row(0, 100_000, args.limit)
        print(json.dumps({"live_100k": out["live_100k"]}), file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    raise SystemExit(main())
