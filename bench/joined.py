"""What a joined fleet adds to the daemon's memory at 100,000 live machines (issue 36 left it unmeasured).

Usage: ``python bench/joined.py [--machines 100000]`` (about a minute). ``bench/steady.py`` runs the real daemon,
but its machines never join (no worker can join 100,000 times on one machine), so its RSS holds the not-joined
indexes and no host states. This bench measures the daemon's view in a child process per variant, built as the
daemon builds it:

- ``facts``: ``bench/steady.py``'s facts (intents of 10 and their instance facts, demand item ``d``), encoded and
  decoded page by page (500 facts a page, as a resync sends them) and folded into a pruning ``FactView``;
- ``joined``: the same, then a host state for every machine, decoded from resync pages as well (70% busy, 30% idle,
  each with the capability report an agent of the template sends), stored in the view's host table;
- ``joined_planned``: ``joined``, then one plan pass with the demand wanting 90% of the fleet, so the planner keeps
  its idle entries (every idle host of the giving item) and its demand balance.

Each child prints the RSS it holds after importing (``base``) and after building (``/proc/self/statm``, after a
full collection), and ``view_mb`` is the difference; ``store_us_per_host``: the CPU time of storing one decoded
host in the view's host table (what a resync's or a push's hosts cost the loop, per host). The last line is JSON:
``{"machines": n, "view_mb": {...per variant}, "joined_extra_mb": joined_planned - facts,
"estimated_daemon_rss_mb_joined": ...}``: the last adds the extra to ``--steady-rss`` (``bench/steady.py``'s figure
for the same fleet not joined, 145.2 MB on the tree that took it; pass your own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("facts", "joined", "joined_planned")
PAGE = 500


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def child(variant: str, machines: int) -> dict[str, float]:
    import gc

    import steady

    from provisionerd.domain.model import (
        CommittedFact,
        DemandItem,
        DemandSnapshot,
        HostState,
        HostStatus,
        Offer,
        ResourceShape,
    )
    from provisionerd.planner.fact_view import FactView, fold
    from provisionerd.planner.health import confirming_report
    from provisionerd.planner.offers import Catalog
    from provisionerd.planner.plan import plan
    from provisionerd.planner.policy import Policy
    from provisionerd.planner.state import PlannerState
    from provisionerd.wire.codec import decode, encode
    from provisionerd.wire.messages import ResyncPage

    gc.collect()
    base = rss_mb()
    now = time.time()
    facts = [CommittedFact(i + 1, f) for i, f in enumerate(steady.live_facts(machines, now - 3600))]
    view = FactView(prune=True)
    for start in range(0, len(facts), PAGE):
        fold(decode(encode(ResyncPage(0, 1, tuple(facts[start : start + PAGE]), ()))).msg.facts, view)
    del facts
    # The simulated plugin's template (providers/simulated/conf/simulated.json), which steady's machines are of.
    attributes = {"type": ("String", "X86_64"), "ncpus": ("Numeric", "8"), "mem": ("Numeric", "32768")}
    offer = Offer(steady.PROVIDER, steady.TEMPLATE, machines, {**attributes, "ngpus": ("Numeric", "0")})
    if variant != "facts":
        report = confirming_report(offer)
        hosts = []
        for n in range(machines):
            _, ref, mid, ip = steady.machine(n)
            status = HostStatus.BUSY if n % 10 < 7 else HostStatus.IDLE
            name = "ip-" + ip.replace(".", "-")
            hosts.append(
                HostState(ref, steady.PROVIDER, mid, status, now - 600 - n % 97, name, ip, capabilities=report)
            )
        spent = 0.0
        for start in range(0, machines, PAGE):  # a page at a time, as the daemon folds a resync's pages
            page = decode(encode(ResyncPage(0, 1, (), tuple(hosts[start : start + PAGE])))).msg.hosts
            started = time.process_time()
            for host in page:
                view.hosts[host.instance_ref] = host
            spent += time.process_time() - started
        store_us = spent / machines * 1e6
        del hosts, page
    if variant == "joined_planned":
        snapshot = DemandSnapshot(1, (DemandItem("d", ResourceShape(ncpus=1), machines * 9 // 10),))
        policy = Policy(cluster=steady.CLUSTER)
        plan(PlannerState.initial("bench"), snapshot, view, Catalog([offer]), view.hosts, now, policy)
    gc.collect()
    figures = {"base_mb": round(base, 1), "rss_mb": round(rss_mb(), 1), "view_mb": round(rss_mb() - base, 1)}
    if variant != "facts":
        figures["store_us_per_host"] = round(store_us, 2)  # storing a decoded host in the view's host table
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--steady-rss", type=float, default=145.2, help="bench/steady.py's daemon RSS, not joined")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.machines)))
        return 0
    figures = {}
    for variant in VARIANTS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--machines", str(args.machines)],
            check=True,
            capture_output=True,
            text=True,
        )
        figures[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{variant}: {figures[variant]}", flush=True)
    extra = round(figures["joined_planned"]["view_mb"] - figures["facts"]["view_mb"], 1)
    print(
        json.dumps(
            {
                "machines": args.machines,
                "view_mb": {v: f["view_mb"] for v, f in figures.items()},
                "joined_extra_mb": extra,
                "estimated_daemon_rss_mb_joined": round(args.steady_rss + extra, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
