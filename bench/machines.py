"""The cost of ``provisionerd machines`` to the daemon's event loop at 100,000 tracked machines (issue 32, item 1).

Usage: ``python bench/machines.py [--machines N] [--limit K] [--repeat N]`` (about a minute). Each admin request of
the command is one call of ``MachinesPager.page`` on the event loop, so its duration is the longest the loop waits
for it. Worlds:

- ``mixed``: ``bench/reconcile.py``'s (1,000 items of 100 machines over 10 providers: 70% busy, 25% idle, 5%
  booting), the default policy;
- ``one_item``: every machine in one demand item, all idle, the item wanting half: the first page that shows one
  of them sorts the item's idle machines once (``planner.outlook.surplus_ranks``), the worst case of the listing;
- ``max_ttl``: the mixed world with a ``max_ttl`` every machine is past (``planner.drain.aged`` read once per
  listing, as the plan reads it on every pass).

Each listing runs as the admin command runs it (``page_async`` in trio, the big parts in a worker thread), with an
instrument timing every task step. Printed per world (milliseconds; medians over ``--repeat`` full listings):
``first_page_ms`` (takes the listing of ids), ``page_ms_median``, ``page_ms_max`` (a page's whole time, worker
threads included), ``loop_step_ms_max`` and ``loop_step_ms_p99`` (the longest task steps of the event loop over
all pages: what any other task waited at most), ``listing_ms`` (all pages), ``pages``. The last line is JSON:
``{"machines": {...per world}}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import trio  # noqa: E402
import trio.lowlevel
from reconcile import EPOCH, NOW, make_world  # noqa: E402

from provisionerd.controller.view import ControllerView  # noqa: E402
from provisionerd.daemon.machines_admin import MachinesPager  # noqa: E402
from provisionerd.domain.model import (  # noqa: E402
    CommittedFact,
    DemandItem,
    DemandSnapshot,
    HostState,
    HostStatus,
    InstanceFact,
    RequestIntent,
    ResourceShape,
)
from provisionerd.planner.fact_view import FactView, fold  # noqa: E402
from provisionerd.planner.policy import Policy, ProviderPolicy  # noqa: E402
from provisionerd.planner.state import PlannerState  # noqa: E402


def one_item_world(n: int) -> tuple[DemandSnapshot, FactView]:
    """``n`` idle machines of one item (intents of 100), idle since staggered times; the item wants ``n // 2``."""
    facts: list[CommittedFact] = []
    view = FactView()
    for k in range(n // 100):
        op_id = f"bench:p:0:{k}"
        refs = tuple(f"ref-{k}-{j}" for j in range(100))
        intent = RequestIntent("p", EPOCH, op_id, "t", 100, refs, ("0" * 64,) * 100, "d")
        facts.append(CommittedFact(len(facts) + 1, intent))
        for j, ref in enumerate(refs):
            machine_id = f"m-{k}-{j}"
            instance = InstanceFact("p", EPOCH, op_id, ref, machine_id, "t", "0" * 64, launch_time=NOW - 3600)
            facts.append(CommittedFact(len(facts) + 1, instance))
            view.hosts[ref] = HostState(ref, "p", machine_id, HostStatus.IDLE, NOW - 1 - (k * 100 + j) % 600)
    fold(facts, view)
    return DemandSnapshot(1, (DemandItem("d", ResourceShape(ncpus=1), n // 2),)), view


class Steps(trio.abc.Instrument):
    """The longest the event loop spent in one task step (what any other task waited at most)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.longest = max(self.longest, time.perf_counter() - self._started)


def listing(view: ControllerView, policy: Policy, limit: int) -> tuple[list[float], list[float], int]:
    """Every page of one listing as the admin command runs it (``page_async`` in trio): per page, the seconds it
    took (worker threads included) and the longest loop step it made; and the machines listed."""
    pager = MachinesPager(lambda: view, lambda: PlannerState.initial("bench"), lambda: policy, lambda: NOW)
    times: list[float] = []
    stalls: list[float] = []
    listed = 0

    async def main() -> None:
        nonlocal listed
        cursor = None
        while True:
            steps.longest = 0.0
            await trio.lowlevel.checkpoint()  # a step boundary: the page starts in a step of its own
            start = time.perf_counter()
            reply = await pager.page_async({"cursor": cursor, "limit": limit})
            times.append(time.perf_counter() - start)
            await trio.lowlevel.checkpoint()
            stalls.append(steps.longest)
            listed += len(reply["machines"])
            cursor = reply["cursor"]
            if cursor is None:
                return

    steps = Steps()
    trio.run(main, instruments=[steps])
    return times, stalls, listed


def measure(view: ControllerView, policy: Policy, limit: int, repeat: int) -> dict[str, Any]:
    gc.collect()
    runs, stalls = [], []
    listed = 0
    for _ in range(repeat):
        time.sleep(0.005)
        times, steps, listed = listing(view, policy, limit)
        runs.append([t * 1e3 for t in times])
        stalls.extend(t * 1e3 for t in steps)
    return {
        "listed": listed,
        "pages": len(runs[0]),
        "first_page_ms": round(statistics.median(times[0] for times in runs), 2),
        "page_ms_median": round(statistics.median(t for times in runs for t in times), 3),
        "page_ms_max": round(max(t for times in runs for t in times), 2),
        "loop_step_ms_max": round(max(stalls), 2),
        "loop_step_ms_p99": round(statistics.quantiles(stalls, n=100)[98], 2),
        "listing_ms": round(statistics.median(sum(times) for times in runs), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, Any] = {"machines": args.machines, "limit": args.limit}
    snapshot, facts, hosts, _ = make_world(args.machines)
    mixed = ControllerView(1, "bench", 1, facts, hosts, snapshot)
    results["mixed"] = measure(mixed, Policy(cluster="bench"), args.limit, args.repeat)
    ttl = Policy(cluster="bench", providers={f"prov{i}": ProviderPolicy(max_ttl=600.0) for i in range(10)})
    results["max_ttl"] = measure(mixed, ttl, args.limit, args.repeat)
    del mixed, facts, hosts
    demand, one = one_item_world(args.machines)
    results["one_item"] = measure(
        ControllerView(1, "bench", 1, one, one.hosts, demand), Policy(cluster="bench"), args.limit, args.repeat
    )
    for world in ("mixed", "max_ttl", "one_item"):
        print(world, results[world], file=sys.stderr)
    print(json.dumps({"machines": results}))


if __name__ == "__main__":
    main()
