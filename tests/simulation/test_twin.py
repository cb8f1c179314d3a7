"""A lease holder is a process: two live daemons with one identity (a ``twin``), and a restart, in the simulation.

The ``twin`` fault starts a second daemon configured with slot a's (or b's) identity, as the same config deployed on
two hosts would be. Each start draws its own ``Join.instance``, so the controller keeps them apart; with a controller
that keys leases by identity alone (the seeded bug below) both are told they hold the same epoch and the simulation
reports ``two_lease_holders``.
"""

from __future__ import annotations

import json
import random

import pytest

from provisionerd.testing.simulation.faults import KINDS, WEIGHTED, Fault, FaultPlan, draw_plan
from provisionerd.testing.simulation.runner import run_world
from provisionerd.testing.simulation.world import World


def events(world: World, who: str, what: str) -> list[tuple[float, dict]]:
    out = []
    for line in world.recorder.trace:
        at, actor, event, fields = line.split(" ", 3)
        if actor == who and event == what:
            out.append((float(at), json.loads(fields)))
    return out


def grants(world: World) -> list[tuple[float, str, str, bool]]:
    return [(at, f["holder"], f["epoch"], f["renewal"]) for at, f in events(world, "controller", "lease_grant")]


def twin_world(seed: int, mode: str = "kill", **overrides) -> World:
    plan = FaultPlan((Fault(30.0, "twin", 90.0, "a", mode=mode),))
    return World(seed, plan=plan, keep_trace=True, **{"workload": "gate", "slots": ("a",), **overrides})


def test_a_twin_is_drawn_after_the_other_faults_and_only_when_faults_are_allowed():
    assert "twin" in KINDS and "twin" not in WEIGHTED
    plans = [draw_plan(random.Random(seed), horizon=200.0, slots=("a", "b"), replicas=3) for seed in range(100)]
    twins = [f for plan in plans for f in plan.faults if f.kind == "twin"]
    assert (
        10 <= len(twins) <= 50 and {f.slot for f in twins} == {"a", "b"} and {f.mode for f in twins} == {"kill", "stop"}
    )
    assert all(5.0 <= f.at and f.ends <= 200.0 + 1e-9 for f in twins)
    for seed, plan in enumerate(plans):  # the twin's draw comes last: every other fault is as drawn without it
        without = draw_plan(random.Random(seed), horizon=200.0, slots=("a", "b"), replicas=3, kinds=WEIGHTED)
        assert without.faults == tuple(f for f in plan.faults if f.kind in WEIGHTED)  # twin, storage: drawn last
        assert sum(f.kind == "twin" for f in plan.faults) <= 1
    assert not any(
        draw_plan(random.Random(s), horizon=200.0, slots=("a",), replicas=3, max_faults=0).faults for s in range(50)
    )


@pytest.mark.parametrize("mode", ["kill", "stop"])
def test_a_twin_with_the_same_identity_is_kept_out_while_the_lease_is_held(mode):
    world = twin_world(3, mode)
    result = run_world(world)
    assert result.ok, result.violations
    holders = {holder for _, holder, _, _ in grants(world)}
    assert len(holders) >= 1 and all(h.startswith("prov-a#") for h in holders)
    twin_denied = events(world, "a.twin#1", "lease_denied")
    assert twin_denied and twin_denied[0][1]["reason"] == "held"  # a holds it; the twin's instance differs
    # The twin never trusted a's epoch: each belief belongs to one instance, and a's epoch 1.1 only to a#1.
    beliefs = {(b.instance, str(b.epoch)) for b in world.recorder.beliefs}
    assert ("a#1", "1.1") in beliefs and ("a.twin#1", "1.1") not in beliefs
    assert events(world, "a.twin#1", "killed" if mode == "kill" else "stopped")


def test_a_controller_that_ignores_the_instance_is_caught(monkeypatch):
    # The bug: the holder key is the identity alone (as before Join.instance), so the twin's acquire looks like a's
    # idempotent re-acquire and both are told they hold the same epoch.
    monkeypatch.setattr("refcontroller.session.holder_key", lambda identity, instance: identity)
    world = twin_world(3)
    found = {v.invariant for v in run_world(world).violations}
    assert "two_lease_holders" in found
    assert not events(world, "a.twin#1", "lease_denied")


def test_a_restarted_daemon_waits_out_its_previous_lease():
    """A crash leaves the lease held by the dead process; its restart is a new holder: it gets ``held`` once, with
    the time left, and acquires within ttl + check interval of the crash (a new epoch)."""
    plan = FaultPlan((Fault(40.0, "kill", 1.0, "a"),))
    world = World(3, plan=plan, keep_trace=True, workload="gate", slots=("a",))
    result = run_world(world)
    assert result.ok, result.violations
    s = world.settings
    ((killed, _),) = events(world, "a#1", "killed")
    ((acquired, grant),) = events(world, "a#2", "lease_acquired")[:1]
    denied = events(world, "a#2", "lease_denied")
    assert 1 <= len(denied) <= 2 and denied[0][1]["reason"] == "held" and denied[0][1]["retry_after"] > 0
    assert killed + 1.0 < acquired <= killed + s.ttl + s.check_interval
    assert grant["epoch"] != events(world, "a#1", "lease_acquired")[-1][1]["epoch"]
