"""The ``bad_machines`` fault (issue 20 item 1): machines that join short of their template are returned with the
reason and replaced, and the lifecycle still converges (``no_convergence`` is checked at the end of every run)."""

from __future__ import annotations

import json

from provisionerd.testing.simulation import World, run_world
from provisionerd.testing.simulation.faults import Fault, FaultPlan


def test_machines_short_of_their_template_are_returned_and_the_demand_is_met_after_the_window() -> None:
    plan = FaultPlan((Fault(5.0, "bad_machines", 120.0),))
    world = World(11, keep_trace=True, plan=plan, workload="lifecycle", provider_cap=8)
    result = run_world(world, wall_budget=60.0)
    assert result.ok, [v.invariant for v in result.violations]
    bad = [line for line in world.recorder.trace if " joined " in line and '"bad": true' in line]
    assert bad, "no machine joined short of its template"
    returns = [
        json.loads(line.split(" ", 3)[3])
        for line in world.recorder.trace
        if " action " in line and "capability_mismatch" in line
    ]
    assert returns and all("ncpus 1 < 2 required" in r.get("reason", json.dumps(r)) for r in returns)
