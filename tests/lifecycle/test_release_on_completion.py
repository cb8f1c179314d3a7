"""Release on completion (issue 20 item 3) through the real loop, executor and gate on MockClock: a reservation's
machines go back within one reconcile interval of its removal from demand; idle machines of other items wait for
their idle time."""

from __future__ import annotations

import trio
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.model import RELEASE_ON_COMPLETION, HostStatus, InstanceFact, RequestIntent, ReturnIntent
from provisionerd.planner.policy import Policy
from provisionerd.testing.fake_provider import FakeProvider

REPLAN = 10.0  # the rig's replan_interval


def test_a_completed_reservation_is_released_at_once_and_other_idle_machines_wait(run_rig):
    seen: dict = {}
    provider = FakeProvider("p", {"small": 10}, launch_time=int(BASE))
    policy = Policy(cluster=CLUSTER, idle_time=300.0, join_deadline=900.0, provisioning_timeout=600.0)
    job = item("job-7", 2, reservation="resv-7", release=RELEASE_ON_COMPLETION)
    other, plain = item("other", 1), item("plain", 1, reservation="resv-8")  # resv-8: tagged, released after idle

    async def scenario(rig, nursery):
        rig.session.set_demand(1, job, other, plain)
        # The view, not the controller's log: the loop plans from the view, which folds the log a moment later.
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 4)
        for machine_id in list(rig.session.view.facts.machines):
            rig.join(machine_id, HostStatus.IDLE)
        await trio.sleep(50)  # every machine idle and needed: nothing goes
        assert rig.facts(ReturnIntent) == []
        seen["removed"] = trio.current_time()
        rig.session.set_demand(2, item("other", 0), item("plain", 0, reservation="resv-8"))  # job-7 completed
        seen["released"] = await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) == 1, limit=REPLAN)
        await trio.sleep(200)  # other and plain are idle and unneeded, but not for 300 s yet
        seen["after_200"] = list(rig.facts(ReturnIntent))
        await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) >= 2, limit=200)
        seen["idle_at"] = trio.current_time()
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, policy=policy)
    by_demand = {i.op_id: i for i in rig.facts(RequestIntent)}
    job_ops = {op for op, i in by_demand.items() if i.demand_id == "job-7"}
    assert {(i.reservation, i.release) for i in by_demand.values() if i.demand_id == "job-7"} == {
        ("resv-7", RELEASE_ON_COMPLETION)
    }
    assert {(i.reservation, i.release) for i in by_demand.values() if i.demand_id == "plain"} == {("resv-8", "")}
    job_machines = {f.machine_id for f in rig.facts(InstanceFact) if f.op_id in job_ops}
    assert seen["released"] - seen["removed"] <= REPLAN
    (released, *_) = seen["after_200"]
    assert len(seen["after_200"]) == 1 and released.reason == "released"
    assert set(released.machine_ids) == job_machines and len(job_machines) == 2
    rest = [r for r in rig.facts(ReturnIntent) if r is not released]
    assert {r.reason for r in rest} == {"idle"} and seen["idle_at"] >= 300.0  # idle since they joined, near 0
