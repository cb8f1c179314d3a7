"""A full paged ``listMachines`` of 100,000 machines from the simulated provider (a real persistent process),
through the daemon's own client, with the event loop watched.

Run from the repository root inside the project's environment::

    python bench/listing.py [--machines 100000] [--page-size 1000] [--rounds 3]

The plugin's state (``--machines`` live machines of one cluster, tagged as the daemon tags them) is written by a
child process, so this process's RSS is the daemon's side only. Each round reads the whole listing the way an
orphan pass does (``execution.orphan_reads.read_listing``: ``PluginClient.list_machines`` over the persistent
transport, schema-checked, page by page) while a ticker task wakes every millisecond and records the longest
gap between its wake-ups (how long anything held the loop), and a trio instrument records the longest single
task step. A last, unwatched read goes through a transport wrapper that measures each page's line.

The last line is JSON: ``machines``, ``pages``, ``bytes`` (all pages), ``max_line_bytes`` and ``line_cap``,
``wall_s`` (median of the rounds), ``max_loop_stretch_ms`` (the ticker's longest gap minus its period, worst
round), ``max_loop_stretch_without_gc_ms`` (the same rounds again with the cyclic collector paused: the paging
code's own stretch), ``max_task_step_ms`` and ``max_task_step_cpu_ms`` (wall and CPU time of the longest single task
step: on a shared machine the wall figures include time the OS gave the core to other processes, the CPU figure
does not), ``max_task_step_cpu_without_gc_ms``, ``max_gc_ms`` (the longest collection, and its generation),
``daemon_rss_mb`` (now) and ``daemon_peak_rss_mb``. Targets: a stretch under 20 ms and no line above the cap.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from provisionerd.execution.orphan_offload import release_off_loop
from provisionerd.execution.orphan_reads import read_listing
from provisionerd.orphans.model import Unreadable
from provisionerd.provider.client import PluginClient
from provisionerd.provider.paging import LIST_PAGE_SIZE
from provisionerd.provider.persistent import open_persistent_provider
from provisionerd.provider.runtime import Limits, PluginTransport, ProviderConfig, dump_json

REPO = Path(__file__).resolve().parents[1]
SIMULATED = REPO / "providers" / "simulated"
CLUSTER = "bench"
TICK = 0.001


def generate(path: str, count: int) -> None:
    """Write the simulated provider's state with ``count`` running machines (run in a child process)."""
    machines = {}
    for n in range(count):
        mid = f"i-{n:017x}"
        ip = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
        op = f"{CLUSTER}-0f3a9e.{n // 1000:04d}"
        ref = f"{CLUSTER}/i-{n:06d}"
        machines[mid] = {
            "machineId": mid,
            "name": "ip-" + ip.replace(".", "-"),
            "privateIpAddress": ip,
            "seq": n,
            "templateId": "sim-cpu-8",
            "requestId": f"req-{n // 1000:06d}",
            "launchtime": 1795945635,
            "state": "running",
            "tags": {
                "provisionerd:cluster": CLUSTER,
                "provisionerd:provider": "simulated",
                "provisionerd:op": op,
                "provisionerd:epoch": "3.17",
                "provisionerd:instance": ref,
            },
            "instanceRef": ref,
            "joinTokenSha256": "0" * 64,
        }
    state = {"version": 1, "next": {"machine": count, "request": count // 1000 + 1}, "ops": {}, "requests": {}}
    state["machines"] = machines
    state["faults"] = {}
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(state, f, separators=(",", ":"))


class Watch(trio.abc.Instrument):
    """The longest single task step (what one task held the loop for without a checkpoint)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_cpu = 0.0
        self.where = ""
        self.where_cpu = ""
        self._started: tuple[float, float] | None = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = (time.perf_counter(), time.thread_time())

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._started is not None:  # not the step that added the instrument
            step = time.perf_counter() - self._started[0]
            # CPU time of the loop's thread: what the step really computed, without the time the OS gave the
            # core to another process (this machine is shared; wall stretches include that).
            cpu = time.thread_time() - self._started[1]
            if cpu > self.longest_cpu:
                self.longest_cpu, self.where_cpu = cpu, task.name
            if step > self.longest:
                self.longest, self.where = step, task.name
        self._started = None


class Measuring:
    """A transport that records the size of every answer's line (the compact JSON the plugin wrote)."""

    def __init__(self, inner: PluginTransport) -> None:
        self.inner = inner
        self.lines: list[int] = []

    @property
    def name(self) -> str:
        return self.inner.name

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        out = await self.inner.call(action, input, timeout=timeout)
        self.lines.append(len(dump_json({"id": 1, "result": out}).encode()))
        return out

    async def aclose(self) -> None:
        await self.inner.aclose()


class GcWatch:
    """The longest garbage collection (``gc.callbacks``): a full collection walks every tracked object, so at
    100k machines it is a stretch of its own, whoever allocated last."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.collections = 0
        self.generation = -1
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            took = time.perf_counter() - self._started
            if took > self.longest:
                self.longest, self.generation = took, info["generation"]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def watched_read(client: PluginClient, expected: int) -> tuple[int, float, float]:
    """One full read with the ticker running: (machines, wall seconds, longest ticker gap in seconds)."""
    longest = 0.0
    done = trio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done.is_set():
            await trio.sleep(TICK)
            now = time.perf_counter()
            longest = max(longest, now - last - TICK)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0.01)  # the ticker runs first
        started = time.perf_counter()
        listing = await read_listing(client, CLUSTER, expected=expected)
        wall = time.perf_counter() - started
        if isinstance(listing, Unreadable):
            raise SystemExit(f"listing unreadable: {listing.reason}")
        count = len(listing)
        held = [listing]
        del listing
        await release_off_loop(held)  # as the orphan pass drops a large observation
        done.set()
    return count, wall, longest


async def main(args: argparse.Namespace) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="provisionerd-bench-listing-"))
    try:
        await trio.run_process([sys.executable, __file__, "--generate", str(data / "state.json"), str(args.machines)])
        limits = Limits()
        config = ProviderConfig(
            name="simulated",
            cluster=CLUSTER,
            path=str(SIMULATED / "provider"),
            transport="persistent",
            conf_dir=str(SIMULATED / "conf"),
            data_dir=str(data),
            timeouts={"listMachines": 120.0},
            limits=limits,
        )
        watch, gc_watch = Watch(), GcWatch()
        async with open_persistent_provider(config) as transport:
            client = PluginClient(transport, page_size=args.page_size)
            await client.describe_provider()  # the process is up
            # The daemon compiles its schema checks once, at its first call of each: not part of a pass.
            await transport.call("listMachines", {"tags": {"provisionerd:cluster": CLUSTER}, "pageSize": 1})
            trio.lowlevel.add_instrument(watch)
            gc.callbacks.append(gc_watch)
            rounds = [await watched_read(client, args.machines) for _ in range(args.rounds)]
            trio.lowlevel.remove_instrument(watch)
            gc.callbacks.remove(gc_watch)
            # The same reads with the cyclic collector paused: the stretch of the paging code itself. A full
            # collection walks every tracked object of the process; at 100k machines it is a stretch whoever
            # allocates, and only a process-wide policy (gc.freeze after a resync, thresholds) can bound it.
            gc.collect()
            gc.disable()
            paused_watch = Watch()
            trio.lowlevel.add_instrument(paused_watch)
            try:
                paused = [await watched_read(client, args.machines) for _ in range(args.rounds)]
            finally:
                gc.enable()
                trio.lowlevel.remove_instrument(paused_watch)
            measuring = Measuring(transport)
            count = len(
                await PluginClient(measuring, page_size=args.page_size).list_machines(
                    {"provisionerd:cluster": CLUSTER}, expected=args.machines
                )
            )
        assert all(n == args.machines for n, _, _ in rounds) and count == args.machines, (rounds, count)
        return {
            "machines": args.machines,
            "page_size": args.page_size,
            "pages": len(measuring.lines),
            "bytes": sum(measuring.lines),
            "max_line_bytes": max(measuring.lines),
            "line_cap": limits.max_line,
            "wall_s": round(statistics.median(w for _, w, _ in rounds), 3),
            "max_loop_stretch_ms": round(max(g for _, _, g in rounds) * 1000, 2),
            "max_loop_stretch_without_gc_ms": round(max(g for _, _, g in paused) * 1000, 2),
            "max_task_step_cpu_without_gc_ms": round(paused_watch.longest_cpu * 1000, 2),
            "max_task_step_cpu_without_gc_in": paused_watch.where_cpu,
            "max_task_step_ms": round(watch.longest * 1000, 2),
            "max_task_step_cpu_ms": round(watch.longest_cpu * 1000, 2),
            "max_task_step_in": watch.where,
            "max_gc_ms": round(gc_watch.longest * 1000, 2),
            "max_gc_generation": gc_watch.generation,
            "gc_collections": gc_watch.collections,
            "daemon_rss_mb": round(rss_mb(), 1),
            "daemon_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rounds": args.rounds,
            "load_at_end": round(os.getloadavg()[0], 2),
        }
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=LIST_PAGE_SIZE)
    parser.add_argument("--rounds", type=int, default=3)
    print(json.dumps(trio.run(main, parser.parse_args())))
