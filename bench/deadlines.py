"""The cost of the reconcile loop's next deadline at 100,000 tracked machines (issue 18 item 6).

Usage: ``python bench/deadlines.py [--machines N] [--repeat N]`` (about half a minute). The world is
``bench/reconcile.py``'s (1,000 templates over 10 providers, most machines busy, some idle, some booting). The loop
sleeps until ``planner.deadlines.next_deadline(state, now, plan.wake_at)``; ``wake_at`` is found on the plan's own
pass (the idle pool, the not-joined heap's top, the open intents). Printed, each the median of ``--repeat``:

- ``plan_ms``: one plan pass (which now also finds ``wake_at``);
- ``next_deadline_us``: the loop's call at each wake, from the plan's ``wake_at`` and the back-off windows;
- ``full_scan_ms``: for comparison, what a scan of every machine and host for its next idle / join deadline costs
  (what the loop would pay per wake without the plan's help).

The last line is JSON: ``{"deadlines": {"machines": n, "plan_ms": ..., "next_deadline_us": ...,
"full_scan_ms": ..., "wake_in_s": ...}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reconcile import NOW, make_world  # noqa: E402

from provisionerd.planner.deadlines import next_deadline  # noqa: E402
from provisionerd.planner.fact_view import MachineState  # noqa: E402
from provisionerd.planner.offers import Catalog  # noqa: E402
from provisionerd.planner.plan import plan  # noqa: E402
from provisionerd.planner.policy import Policy  # noqa: E402
from provisionerd.planner.state import PlannerState  # noqa: E402


def full_scan(view, hosts, now: float, policy: Policy) -> float:
    """The next idle or join deadline by reading every active machine and its host."""
    best = float("inf")
    for machine in view.machines.values():
        if machine.state is not MachineState.ACTIVE:
            continue
        own = policy.of(machine.provider)
        host = hosts.get(machine.instance_ref)
        at = machine.launch_time + own.join_deadline if host is None else host.since + own.idle_time
        if now < at < best:
            best = at
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    snapshot, view, hosts, offers = make_world(args.machines)
    catalog = Catalog(offers)
    policy = Policy(cluster="bench", step_limit=1000)
    state = PlannerState.initial("b")
    plan(state, snapshot, view, catalog, hosts, NOW, policy)  # warm the catalog's rankings
    plans, calls, scans = [], [], []
    result = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = plan(state, snapshot, view, catalog, hosts, NOW, policy)
        plans.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(1000):
            deadline = next_deadline(result.state, NOW, result.wake_at)
        calls.append((time.perf_counter() - t0) / 1000)
        t0 = time.perf_counter()
        full_scan(view, hosts, NOW, policy)
        scans.append(time.perf_counter() - t0)
    assert result is not None
    summary = {
        "machines": args.machines,
        "plan_ms": round(statistics.median(plans) * 1e3, 2),
        "next_deadline_us": round(statistics.median(calls) * 1e6, 2),
        "full_scan_ms": round(statistics.median(scans) * 1e3, 2),
        "wake_in_s": None if deadline is None else round(deadline - NOW, 3),
    }
    print(json.dumps({"deadlines": summary}))


if __name__ == "__main__":
    main()
