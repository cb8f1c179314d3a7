"""Restarts, reclaims, lease loss and rejoins on MockClock."""

from __future__ import annotations

import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.model import (
    NO_EPOCH,
    HostStatus,
    InstanceFact,
    Lost,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.domain.tokens import instance_refs, issue


def test_an_open_intent_left_by_a_previous_process_is_settled_and_the_shortfall_is_a_new_op(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        # "The previous process": committed an intent for 3, its call made 2 machines, then it died.
        old_op = f"{CLUSTER}:p:old:0"
        issued = issue(instance_refs(old_op, 3))
        epoch = rig.keepers["p"].current()
        await rig.executor._committer.commit(
            RequestIntent(
                "p",
                epoch,
                old_op,
                "small",
                3,
                tuple(t.instance_ref for t in issued),
                tuple(t.hash for t in issued),
                "d",
            )
        )
        doc = {
            "template": {"templateId": "small", "machineCount": 2},
            "op_id": old_op,
            "tags": {
                "provisionerd:cluster": CLUSTER,
                "provisionerd:provider": "p",
                "provisionerd:op": old_op,
                "provisionerd:epoch": str(epoch),
            },
            "bootstrap": [
                {"instanceRef": t.instance_ref, "controllers": ["ctl0:7400"], "joinToken": t.token} for t in issued[:2]
            ],
        }
        await provider.call("requestMachines", doc)
        provider.calls.clear()
        # The new process starts with the controller's facts only.
        rig.session.rejoin(list(rig.controller.facts))
        await nursery.start(rig.loop.run)
        start = trio.current_time()
        rig.session.set_demand(1, item("d", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)
        seen.update(old_op=old_op, issued=issued, at=trio.current_time() - start)

    rig = run_rig(scenario, {"p": provider}, loop=False)
    old_op, issued = seen["old_op"], seen["issued"]
    # Nothing is requested while the old intent still owes machines; it is settled by one listing in the first
    # cycle after the grant (not after recover_after, 30 s: no task of this process ever ran it).
    assert [a for a, _ in rig.calls("p")][:1] == ["listMachines"]
    made = rig.facts(InstanceFact)
    old = [f for f in made if f.op_id == old_op]
    assert len(old) == 2
    assert {f.token_hash for f in old} == {t.hash for t in issued[:2]}  # they keep the tokens they booted with
    (failed,) = rig.facts(RequestFailed)
    assert failed.op_id == old_op and "2 of 3" in failed.reason
    new_ops = {doc["op_id"] for _, doc in rig.calls("p", "requestMachines")}
    assert len(new_ops) == 1 and old_op not in new_ops
    (new_intent,) = [i for i in rig.facts(RequestIntent) if i.op_id in new_ops]
    assert new_intent.count == 1  # only the shortfall, with a fresh token
    assert len(rig.running()) == 3
    assert seen["at"] < 5.0, seen["at"]  # demand met again within 5 s of the lease grant (MockClock)


def test_reclaimed_machines_are_retired_as_lost(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 2))
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 2)
        victim = rig.facts(InstanceFact)[0].machine_id
        provider.reclaim(victim)
        await rig.wait_for(lambda: rig.facts(Lost))
        seen["lost_at"] = trio.current_time()
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)  # replaced
        seen.update(victim=victim)

    rig = run_rig(scenario, {"p": provider})
    (lost,) = rig.facts(Lost)
    assert lost.machine_id == seen["victim"] and lost.reason == "reclaimed"
    assert seen["lost_at"] == 30.0  # the first getReturnRequests poll (reclaim_interval 30 s)
    asked = rig.calls("p", "getReturnRequests")[0][1]
    assert {m["machineId"] for m in asked["machines"]} == {f.machine_id for f in rig.facts(InstanceFact)[:2]}


def test_no_request_without_a_lease_and_none_after_it_lapses(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: rig.facts(InstanceFact))
        rig.link.partition()  # renewals stop: the lease lapses at its local deadline
        await rig.wait_for(lambda: not rig.keepers["p"].valid(), limit=100)
        lapsed_at = trio.current_time()
        rig.session.set_demand(2, item("d", 4))
        await trio.sleep(20)
        seen["requests_while_lapsed"] = len(rig.calls("p", "requestMachines"))
        rig.link.heal()
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 4, limit=200)
        seen.update(lapsed_at=lapsed_at)

    rig = run_rig(scenario, {"p": provider})
    assert seen["requests_while_lapsed"] == 1
    assert any(e["reason"] == "no provider lease" for e in rig.events_of("reconcile_skipped"))
    intents = rig.facts(RequestIntent)
    assert len(intents) == 2 and intents[1].epoch > intents[0].epoch  # re-acquired with a new epoch


def test_a_refused_return_is_resumed_with_the_same_op_id(run_rig):
    from provisionerd.domain.errors import ProviderRejected

    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 1)
        machine = rig.facts(InstanceFact)[0].machine_id
        rig.join(machine, HostStatus.IDLE)
        provider.fail_next(
            "requestReturnMachines", ProviderRejected("p", "requestReturnMachines", "throttled", "slow down")
        )
        rig.session.set_demand(2, item("d", 0))
        await rig.wait_for(lambda: rig.facts(Returned))
        seen.update(machine=machine)

    rig = run_rig(scenario, {"p": provider})
    (intent,) = rig.facts(ReturnIntent)
    calls = rig.calls("p", "requestReturnMachines")
    assert len(calls) == 2 and {doc["op_id"] for _, doc in calls} == {intent.op_id}
    assert rig.facts(Returned)[0].machine_ids == (seen["machine"],)
    assert rig.running() == []


def test_after_a_rejoin_the_loop_plans_from_the_new_view_only(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        rig.session.set_demand(5, item("d", 2))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 2)
        # A failover: the new view is rebuilt from the facts; its demand numbering starts over, lower.
        rig.session.rejoin(list(rig.controller.facts))
        await trio.sleep(30)
        seen["before_demand"] = len(rig.calls("p", "requestMachines"))
        rig.session.set_demand(1, item("d", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)

    rig = run_rig(scenario, {"p": provider})
    assert seen["before_demand"] == 1  # no demand on the new link yet: nothing planned
    assert len(rig.calls("p", "requestMachines")) == 2  # the lower seq of the new link is not "stale"
    assert NO_EPOCH not in {f.epoch for f in rig.facts()}
