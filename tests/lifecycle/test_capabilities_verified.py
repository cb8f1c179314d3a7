"""Capabilities verified by default (issue 35 item 1), on the lifecycle rig (MockClock; the real lease keepers,
gate, executor, offer feed and reconcile loop against a fake controller and the in-memory provider).

A GPU template's machine whose agent's report leaves out ``ngpus`` (a CPU-only report: no GPU runtime answered, or an
agent that measures nothing) is not supply: it is returned ``capability_mismatch`` and replaced. With the check
turned off for that template (``unverified_templates``) the same machine is supply and kept.
"""

from __future__ import annotations

import trio
from lifecycle_rig import BASE, CLUSTER

from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape, ReturnIntent
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.testing.fake_provider import FakeProvider

GPU = {"ncpus": ("Numeric", "2"), "ngpus": ("Numeric", "1")}
CPU_ONLY = {"ncpus": "2"}  # what the agent of a machine whose GPU runtime is missing confirms
GPU_ITEM = DemandItem("d", ResourceShape(ncpus=1, gpus=1), 1)


def provider() -> FakeProvider:
    return FakeProvider("p", {"gpu": 10}, launch_time=int(BASE), attributes={"gpu": GPU})


def policy(**own: object) -> Policy:
    return Policy(
        cluster=CLUSTER,
        idle_time=600.0,
        join_deadline=900.0,
        provisioning_timeout=600.0,
        providers={"p": ProviderPolicy(idle_time=600.0, **own)},  # type: ignore[arg-type]
    )


def test_a_report_that_omits_the_templates_gpus_is_not_supply_and_is_replaced(run_rig):
    seen: dict = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, GPU_ITEM)
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 1)
        (made,) = rig.facts(InstanceFact)
        rig.join_reporting(made.machine_id, CPU_ONLY)
        seen["joined_at"] = trio.current_time()
        await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) == 1, limit=60.0)
        seen["returned_at"] = trio.current_time()
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 2, limit=300.0)  # the replacement
        seen["first"] = made.machine_id

    rig = run_rig(scenario, {"p": provider()}, policy=policy())
    (back,) = rig.facts(ReturnIntent)
    assert back.machine_ids == (seen["first"],)
    assert back.reason == "capability_mismatch: ngpus not reported ('1' declared)"
    assert seen["returned_at"] - seen["joined_at"] <= 1.0  # the next pass, not a deadline
    first, replacement = rig.facts(RequestIntent)
    assert (replacement.template_id, replacement.count) == ("gpu", 1)


def test_with_the_check_turned_off_for_the_template_the_same_machine_is_supply(run_rig):
    seen: dict = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, GPU_ITEM)
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 1)
        (made,) = rig.facts(InstanceFact)
        rig.join_reporting(made.machine_id, CPU_ONLY)
        await trio.sleep(300.0)  # many passes, and the capacity back-off a mismatch would have set, all over
        seen["running"] = [m["machineId"] for m in rig.running()]
        seen["made"] = made.machine_id

    rig = run_rig(scenario, {"p": provider()}, policy=policy(unverified_templates={"gpu"}))
    assert rig.facts(ReturnIntent) == []
    assert len(rig.facts(RequestIntent)) == 1
    assert seen["running"] == [seen["made"]]
    assert not rig.events_of("plan_note", kind="capability_mismatch")
