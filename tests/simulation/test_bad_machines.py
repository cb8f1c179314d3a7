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


def test_the_bad_machines_fault_is_drawn_after_the_others_so_their_draws_keep() -> None:
    import random

    from provisionerd.testing.simulation.faults import KINDS, draw_plan

    later = ("reload", "controller_restart")  # drawn after bad_machines
    without = tuple(k for k in KINDS if k not in ("bad_machines", *later))
    drawn = 0
    for seed in range(300):
        args = {"horizon": 200.0, "slots": ("a", "b"), "replicas": 3}
        new = draw_plan(random.Random(seed), kinds=tuple(k for k in KINDS if k not in later), **args)
        old = draw_plan(random.Random(seed), kinds=without, **args)
        assert tuple(f for f in new.faults if f.kind != "bad_machines") == old.faults
        drawn += "bad_machines" in new.kinds()
    assert 50 <= drawn <= 110  # BAD_MACHINES_CHANCE = 0.25


def test_the_controller_restart_fault_is_drawn_last_so_every_other_draw_keeps() -> None:
    import random

    from provisionerd.testing.simulation.faults import KINDS, draw_plan

    without = tuple(k for k in KINDS if k != "controller_restart")
    drawn = 0
    for seed in range(300):
        args = {"horizon": 200.0, "slots": ("a", "b"), "replicas": 3}
        new = draw_plan(random.Random(seed), **args)
        old = draw_plan(random.Random(seed), kinds=without, **args)
        assert tuple(f for f in new.faults if f.kind != "controller_restart") == old.faults
        drawn += "controller_restart" in new.kinds()
    assert 60 <= drawn <= 125  # CONTROLLER_RESTART_CHANCE = 0.3
