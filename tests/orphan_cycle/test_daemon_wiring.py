"""The orphan cycle inside the real ``DaemonCore`` (session, lease keeper, gate, the real executor, the reconcile
loop), against the reference controller over in-memory streams and an in-memory provider, on MockClock."""

from __future__ import annotations

import trio
import trio.testing
from cycle_world import OLD, tags
from rigs.lease_holder import holding_lease
from rigs.memory import memory_config, memory_core, open_memory_controller, running

from provisionerd.domain.model import NO_EPOCH, TAG_CLUSTER, InstanceFact, Lost, RequestIntent, Returned, ReturnIntent
from provisionerd.orphans.model import orphan_op_id
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

NOW = OLD + 4000.0
SETTLE = 20.0


def test_the_daemon_retires_a_ghost_and_terminates_a_stray_through_the_gate_and_leaves_untagged_alone(tmp_path):
    fake = FakeProvider("sim", launch_time=OLD)
    for machine_id, machine_tags in [
        ("i-stray", tags("op-stray")),
        ("i-untagged", {}),
        ("i-cluster-only", {TAG_CLUSTER: "clu"}),
    ]:
        fake.machines[machine_id] = {
            "machineId": machine_id,
            "name": machine_id,
            "status": "running",
            "template": "small",
            "launchtime": OLD,
            "privateIpAddress": "10.3.0.1",
            "instanceRef": "",
            "tags": machine_tags,
        }
    events = EventLog(keep=100_000)
    seen = {}

    async def main():
        async with open_memory_controller(tmp_path, 1, ttl=30.0) as net:
            config = memory_config(
                tmp_path, net.addresses, orphans={"action": "terminate", "interval": 30, "settle": SETTLE}
            )
            async with holding_lease(config, "sim", net.connect, identity="someone-before") as holder:
                await holder.commit(
                    RequestIntent("sim", NO_EPOCH, "op-ghost", "small", 1, ("clu/op-ghost/0",), ("b" * 64,)),
                    InstanceFact(
                        "sim", NO_EPOCH, "op-ghost", "clu/op-ghost/0", "i-ghost", "small", "b" * 64, launch_time=NOW
                    ),
                )
            core = memory_core(net, config, fake, events=events, wall=lambda: NOW + trio.current_time())
            async with running(core):
                await trio.sleep(200)
                seen["epoch"] = core.keepers["sim"].current()
                seen["cycles"] = core.orphan_cycles
            seen["facts"] = [c.fact for c in net.facts()]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    epoch = seen["epoch"]
    terminate_op = orphan_op_id("sim", "tagged_unknown", "i-stray", "terminate")
    ours = [f for f in seen["facts"] if f.op_id.startswith("orphan-")]
    assert sorted(type(f).__name__ for f in ours) == ["Lost", "ReturnIntent", "Returned"]
    (lost,) = [f for f in ours if isinstance(f, Lost)]
    (intent,) = [f for f in ours if isinstance(f, ReturnIntent)]
    (returned,) = [f for f in ours if isinstance(f, Returned)]
    assert lost.machine_id == "i-ghost" and lost.epoch == epoch
    assert intent == ReturnIntent("sim", epoch, terminate_op, ("i-stray",), "orphan tagged_unknown: terminate")
    assert returned.machine_ids == ("i-stray",) and returned.epoch == epoch
    # The provider saw one mutation, the orphan return, for the stray only.
    mutations = [(a, doc) for a, doc in fake.calls if a in ("requestReturnMachines", "stopMachines", "requestMachines")]
    assert [(a, doc["op_id"], [m["machineId"] for m in doc["machines"]]) for a, doc in mutations] == [
        ("requestReturnMachines", terminate_op, ["i-stray"])
    ]
    assert fake.machines["i-untagged"]["status"] == fake.machines["i-cluster-only"]["status"] == "running"
    # Audited, and not before the settle window after the join.
    joined = next(e["mono"] for e in events.of_kind("resync"))
    actions = list(events.of_kind("orphan_action"))
    assert {(e["action"], e["outcome"]) for e in actions} == {("retire", "ok"), ("terminate", "ok")}
    assert all(e["mono"] >= joined + SETTLE for e in actions)
    assert all(e["epoch"] == epoch for e in actions)
    # The first pass, at start, acted on nothing: inside the settle window after the join, or (when trio runs it
    # before the link is up) skipped without listing, as a pass without the controller's view could tell no
    # machine apart. Every pass that listed came after the join.
    passes = list(events.of_kind("orphan_pass"))
    if passes[0].get("listed") is False:
        assert "controller link is" in passes[0]["skipped"]["view_unreadable"] and passes[0]["mono"] <= joined
    else:
        assert passes[0]["settled"] is False
    listed = [e for e in passes if e.get("listed") is not False]
    assert len(listed) >= 5 and all(e["mono"] >= joined for e in listed)
    assert set(seen["cycles"]) == {"sim"}
