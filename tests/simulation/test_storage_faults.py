"""The simulation's storage faults (issue 15, item 7): a controller whose disk is full for a while
(``storage_failure``) and one that comes back on an empty store (``store_loss``): the daemons halt, make no
provider mutation, keep every machine until the admin accepts the reset, then the lifecycle goes on. Each check
can fail: a daemon that does not halt is ``mutation_while_halted``, a machine gone unnoticed ``machine_forgotten``.
"""

from __future__ import annotations

import json

import pytest

from provisionerd.controller import amnesia
from provisionerd.testing.simulation.cloud import SimCloud
from provisionerd.testing.simulation.faults import Fault, FaultPlan
from provisionerd.testing.simulation.runner import run_world
from provisionerd.testing.simulation.world import World

SEED = 35  # a lifecycle world whose demand has a machine running before 40 s


def trace(world: World) -> list[tuple[float, str, str, dict]]:
    out = []
    for line in world.recorder.trace:
        at, who, what, fields = line.split(" ", 3)
        out.append((float(at), who, what, json.loads(fields)))
    return out


def loss_world(*extra: Fault) -> World:
    plan = FaultPlan(tuple(sorted((Fault(40.0, "store_loss", 40.0), *extra), key=lambda f: f.at)))
    return World(SEED, plan=plan, keep_trace=True, workload="lifecycle", slots=("a",))


def test_after_a_store_loss_the_daemon_halts_keeps_its_machines_and_resumes_after_the_reset():
    world = loss_world()
    result = run_world(world)
    assert result.ok, result.violations
    seen = trace(world)
    assert world.losses.forgotten, "no machine ran at the loss: the check would be empty"
    halted = [at for at, who, what, f in seen if what == "must_halt"]
    resumed = [at for at, who, what, f in seen if what == "may_resume"]
    assert halted == [40.0] and resumed and resumed[0] >= 80.0
    assert any(what == "controller_amnesia" for _, _, what, _ in seen)
    mutations = [at for at, who, what, f in seen if what == "mutation"]
    assert not [at for at in mutations if halted[0] <= at < resumed[0]]
    assert [at for at in mutations if at >= resumed[0]], "the lifecycle did not resume after the reset"
    assert all(world.cloud.machines[m]["status"] == "running" for m in world.losses.forgotten)


def test_a_daemon_that_does_not_halt_on_a_new_incarnation_is_caught(monkeypatch):
    # The bug: the daemon's rules find nothing wrong with a new incarnation or an epoch granted again.
    monkeypatch.setattr(amnesia, "judge_join", lambda memory, incarnation, last_index: None)
    monkeypatch.setattr(amnesia, "judge_grant", lambda memory, provider, epoch, held: None)
    result = run_world(loss_world())
    assert "mutation_while_halted" in {v.invariant for v in result.violations}


def test_a_machine_gone_during_the_halt_is_caught_unless_a_vanish_fault_took_it(monkeypatch):
    world = loss_world(Fault(50.0, "vanish"))
    result = run_world(world)
    assert result.ok, result.violations  # the vanish fault took it: allowed
    real_vanish = SimCloud.vanish

    def unrecorded(self: SimCloud) -> str | None:  # the bug: a machine disappears and nobody knows why
        gone = real_vanish(self)
        self.vanished.discard(gone or "")
        return gone

    monkeypatch.setattr(SimCloud, "vanish", unrecorded)
    result = run_world(loss_world(Fault(50.0, "vanish")))
    assert "machine_forgotten" in {v.invariant for v in result.violations}


@pytest.mark.parametrize(("seed", "workload"), [(1, "gate"), (4, "lifecycle")])
def test_a_full_disk_is_refused_typed_and_the_run_stays_clean(seed, workload):
    # SQLite at max_page_count refuses only the writes that need one more page: these seeds make some.
    plan = FaultPlan((Fault(25.0, "storage_failure", 60.0),))
    world = World(seed, plan=plan, keep_trace=True, workload=workload, slots=("a",))
    result = run_world(world)
    assert result.ok, result.violations
    refused = [(at, f) for at, who, what, f in trace(world) if what == "controller_storage_failure"]
    assert refused and world.cluster is not None and world.cluster.storage_failures >= len(refused)
    assert all(25.0 <= at < 85.0 for at, _ in refused)  # only while the disk is full
