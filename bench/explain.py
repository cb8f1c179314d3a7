"""The cost of ``provisionerd explain`` and ``plan --what-if`` to the daemon's event loop at 100,000 machines
(issue 32, items 2 and 3).

Usage: ``python bench/explain.py [--machines N] [--repeat N]``. The world is ``bench/reconcile.py``'s (1,000 items
of 100 machines over 10 providers and 1,000 templates; GPU items want 20 more than they have, the next items 20
fewer); the what-if asks for 1,000 new items of 50 machines. Each request runs as the admin command runs it
(``Explainer.answer`` in trio: the copies of the view, the plan and the document in a worker thread), with an
instrument timing every task step. Printed (milliseconds, medians over ``--repeat``): ``answer_ms`` (the whole
answer, thread included), ``loop_step_ms_max`` (the longest task step of the event loop during it: what any other
task waited at most), ``reply_kb``, and ``plan_inline_ms`` (one plan of the same world run on the loop, for
scale: what the loop's own cycle costs). The last line is JSON.
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

import attrs  # noqa: E402
import trio  # noqa: E402
import trio.lowlevel  # noqa: E402
from machines import Steps  # noqa: E402
from reconcile import NOW, make_world  # noqa: E402

from provisionerd.controller.view import ControllerView  # noqa: E402
from provisionerd.daemon.explain_admin import Explainer, Sources  # noqa: E402
from provisionerd.domain.model import DemandItem, ResourceShape  # noqa: E402
from provisionerd.planner.in_flight import NOTHING_IN_FLIGHT  # noqa: E402
from provisionerd.planner.offers import Catalog  # noqa: E402
from provisionerd.planner.plan import plan  # noqa: E402
from provisionerd.planner.policy import Policy  # noqa: E402
from provisionerd.planner.rejoin import Rejoin  # noqa: E402
from provisionerd.planner.state import PlannerState  # noqa: E402


@attrs.define
class BenchLoop:
    state: PlannerState
    policy: Policy
    rejoin: Rejoin = Rejoin(float("-inf"), frozenset())

    def leased(self) -> list[str]:
        return [f"prov{i}" for i in range(10)]

    def settle_windows(self) -> dict[str, dict[str, Any]]:
        return {}


def answer(explainer: Explainer, what_if: tuple[DemandItem, ...] | None) -> tuple[float, float, int]:
    """(seconds for the answer, the longest loop step meanwhile, reply bytes)."""
    steps = Steps()
    found: dict[str, Any] = {}

    async def main() -> None:
        await trio.lowlevel.checkpoint()  # a step boundary: the answer starts in a step of its own
        steps.longest = 0.0
        start = time.perf_counter()
        reply = await explainer.answer(what_if, None)
        found["s"] = time.perf_counter() - start
        await trio.lowlevel.checkpoint()
        found["stall"] = steps.longest
        found["bytes"] = len(json.dumps(reply))

    trio.run(main, instruments=[steps])
    return found["s"], found["stall"], found["bytes"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    snapshot, facts, hosts, offers = make_world(args.machines)
    view = ControllerView(1, "bench", 1, facts, hosts, snapshot)
    policy = Policy(cluster="bench", step_limit=1_000_000)
    state = PlannerState.initial("bench")
    loop = BenchLoop(plan(state, snapshot, facts, Catalog(offers), hosts, NOW, policy).state, policy)
    sources = Sources(
        view=lambda: view,
        loop=loop,
        in_flight=lambda: NOTHING_IN_FLIGHT,
        offers=lambda: offers,
        leases={},
        guard_status=lambda: {"halted": False},
        wall=lambda: NOW,
    )
    explainer = Explainer(sources)
    what_if = tuple(DemandItem(f"w{i:04d}", ResourceShape(ncpus=2, gpus=i % 2), 50) for i in range(1000))
    results: dict[str, Any] = {"machines": args.machines}
    for name, hypothetical in (("explain", None), ("what_if", what_if)):
        runs = []
        for _ in range(args.repeat):
            gc.collect()
            runs.append(answer(explainer, hypothetical))
        results[name] = {
            "answer_ms": round(statistics.median(r[0] for r in runs) * 1e3, 1),
            "loop_step_ms_max": round(max(r[1] for r in runs) * 1e3, 2),
            "reply_kb": round(runs[0][2] / 1024, 1),
        }
    start = time.perf_counter()
    plan(loop.state, snapshot, facts, Catalog(offers), hosts, NOW, policy)
    results["plan_inline_ms"] = round((time.perf_counter() - start) * 1e3, 1)
    print(json.dumps({"explain": results}))


if __name__ == "__main__":
    main()
