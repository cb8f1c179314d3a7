"""The request flow on MockClock: intent before call, tags and bootstrap, poll back-off, instance facts, timeout."""

from __future__ import annotations

import json

import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_OP,
    TAG_PROVIDER,
    HostStatus,
    InstanceFact,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.domain.tokens import token_hash


def test_demand_becomes_an_intent_then_a_call_then_polled_instance_facts(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, boot_polls=3, launch_time=int(BASE))

    async def scenario(rig, nursery):
        start = trio.current_time()
        rig.session.set_demand(1, item("d", 2))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 2)
        seen["done_at"] = trio.current_time() - start
        await trio.sleep(1)  # let the action's task finish (its result event)
        seen["start"] = start

    rig = run_rig(scenario, {"p": provider})
    start = seen["start"]
    intents = rig.facts(RequestIntent)
    assert len(intents) == 1
    intent = intents[0]
    assert (intent.provider, intent.template_id, intent.count, intent.demand_id) == ("p", "small", 2, "d")
    requests = rig.calls("p", "requestMachines")
    assert len(requests) == 1
    doc = requests[0][1]
    assert doc["op_id"] == intent.op_id
    assert doc["tags"] == {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: "p", TAG_OP: intent.op_id, TAG_EPOCH: str(intent.epoch)}
    boots = doc["bootstrap"]
    assert [b["instanceRef"] for b in boots] == list(intent.instance_refs)
    assert [token_hash(b["joinToken"]) for b in boots] == list(intent.token_hashes)
    assert len({b["joinToken"] for b in boots}) == 2 and all(":" not in b["joinToken"] for b in boots)
    assert all(b["controllers"] == ["ctl0:7400"] for b in boots)
    # The intent was committed (index 1) before the provider was called; the instance facts after.
    kinds = [type(c.fact).__name__ for c in rig.controller.facts]
    assert kinds == ["RequestIntent", "InstanceFact", "InstanceFact"]
    # Polls back off 1, 2, 4 s from the call: at +1, +3, +7; complete on the 4th (+15).
    polls = [t - start for t in rig.providers["p"].poll_times["req-1"]]
    assert polls == [1.0, 3.0, 7.0, 15.0]
    assert seen["done_at"] == 15.0
    facts = {f.instance_ref: f for f in rig.facts(InstanceFact)}
    for boot in boots:
        fact = facts[boot["instanceRef"]]
        assert fact.token_hash == token_hash(boot["joinToken"])
        assert fact.op_id == intent.op_id and fact.launch_time == BASE and fact.hostname.startswith("host-")
    # No token anywhere in the events stream.
    text = json.dumps(list(rig.events.recent), default=str)
    assert all(b["joinToken"] not in text for b in boots)
    phases = [e["phase"] for e in rig.events_of("action", op_id=intent.op_id)]
    assert phases == ["planned", "called", "result"]
    assert any(e["outcome"] == "admitted" for e in rig.events_of("gate", op_id=intent.op_id))


def test_replanning_the_same_snapshot_requests_nothing_more(run_rig):
    provider = BootingProvider("p", {"small": 10}, boot_polls=1, launch_time=int(BASE))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)
        await trio.sleep(200)  # many timer replans, a replayed snapshot
        rig.session.set_demand(1, item("d", 3))
        await trio.sleep(50)

    rig = run_rig(scenario, {"p": provider})
    assert len(rig.calls("p", "requestMachines")) == 1
    assert len(rig.running()) == 3 and rig.loop.cycles > 10


def test_a_request_not_complete_in_time_fails_and_its_machines_are_returned(run_rig):
    seen: dict = {}

    # One machine of two is made and never finishes booting; the request never completes.
    provider = BootingProvider("p", {"small": 10}, boot_polls=float("inf"), make=1, launch_time=int(BASE))

    async def scenario(rig, nursery):
        start = trio.current_time()
        rig.session.set_demand(1, item("d", 2))
        await rig.wait_for(lambda: rig.facts(Returned))
        seen["returned_at"] = trio.current_time() - start
        rig.session.set_demand(2, item("d", 0))  # stop asking, so no new request hangs around

    rig = run_rig(scenario, {"p": provider})
    intent = rig.facts(RequestIntent)[0]
    failed = rig.facts(RequestFailed)
    assert [f.op_id for f in failed] == [intent.op_id] and failed[0].reason == "provisioning_timeout"
    made = rig.facts(InstanceFact)
    assert [f.op_id for f in made] == [intent.op_id]  # the one machine that exists is explained...
    returns = rig.facts(ReturnIntent)
    assert returns[0].machine_ids == (made[0].machine_id,) and returns[0].reason == "provisioning_timeout"
    assert rig.facts(Returned)[0].machine_ids == (made[0].machine_id,)  # ...and given back
    # provisioning_timeout is 600 s: the request fails at 600 and the return is confirmed at its first poll (+1).
    assert seen["returned_at"] == 601.0
    assert rig.providers["p"].machines[made[0].machine_id]["status"] == "terminated"
    kinds = [type(c.fact).__name__ for c in rig.controller.facts]
    assert kinds.index("ReturnIntent") < kinds.index("Returned")


def test_idle_machines_are_returned_when_demand_drops(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 2))
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 2)  # folded into the view
        for fact in rig.facts(InstanceFact):
            rig.join(fact.machine_id, HostStatus.IDLE)
        idle_from = trio.current_time()
        rig.session.set_demand(2, item("d", 0))
        await rig.wait_for(lambda: rig.facts(Returned))
        seen["after"] = trio.current_time() - idle_from

    rig = run_rig(scenario, {"p": provider})
    assert rig.running() == []
    (ret,) = rig.facts(ReturnIntent)
    assert ret.reason == "idle" and len(ret.machine_ids) == 2
    # idle_time 300 s; the loop replans every 10 s, so the return starts within one interval of it.
    assert 300.0 <= seen["after"] <= 311.0
    call = rig.calls("p", "requestReturnMachines")[0][1]
    assert call["op_id"] == ret.op_id and call["tags"][TAG_OP] == ret.op_id
