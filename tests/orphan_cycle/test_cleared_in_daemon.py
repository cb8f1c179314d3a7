"""The orphan pass inside the real ``DaemonCore`` clears the machines its view explains while it reads the listing
(``orphans.sift``): they are counted, never held or classified in full, while a stray in the same listing is still
found. Reference controller over in-memory streams, an in-memory provider, MockClock."""

from __future__ import annotations

import trio
import trio.testing
from cycle_world import OLD, tags
from rigs.lease_holder import holding_lease
from rigs.memory import memory_config, memory_core, open_memory_controller, running

from provisionerd.domain.model import NO_EPOCH, TAG_INSTANCE, InstanceFact, RequestIntent
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

NOW = OLD + 4000.0
COUNT = 6


def listed(machine_id: str, launch: float, machine_tags: dict[str, str]) -> dict[str, object]:
    return {
        "machineId": machine_id,
        "name": machine_id,
        "status": "running",
        "template": "small",
        "launchtime": int(launch),
        "privateIpAddress": "10.3.0.1",
        "tags": machine_tags,
    }


def test_machines_the_view_explains_are_cleared_as_listed_and_a_stray_is_still_found(tmp_path):
    fake = FakeProvider("sim", launch_time=OLD)
    refs = tuple(f"clu/op-young/{n}" for n in range(COUNT))
    for n, ref in enumerate(refs):  # launched a minute ago: inside the join deadline, no host yet
        fake.machines[f"i-young-{n}"] = listed(f"i-young-{n}", NOW, tags("op-young", **{TAG_INSTANCE: ref}))
    fake.machines["i-stray"] = listed("i-stray", OLD, tags("op-stray"))
    events = EventLog(keep=100_000)

    async def main():
        async with open_memory_controller(tmp_path, 1, ttl=30.0) as net:
            config = memory_config(tmp_path, net.addresses, orphans={"action": "report", "interval": 30, "settle": 20})
            async with holding_lease(config, "sim", net.connect, identity="someone-before") as holder:
                await holder.commit(
                    RequestIntent("sim", NO_EPOCH, "op-young", "small", COUNT, refs, ("b" * 64,) * COUNT)
                )
                for n, ref in enumerate(refs):
                    fact = InstanceFact("sim", NO_EPOCH, "op-young", ref, f"i-young-{n}", "small", "b" * 64)
                    await holder.commit(fact)
            core = memory_core(net, config, fake, events=events, wall=lambda: NOW + 60 + trio.current_time())
            async with running(core):
                await trio.sleep(120)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    passes = [e for e in events.of_kind("orphan_pass") if e.get("listed") is not False and not e["skipped"]]
    assert len(passes) >= 2
    for event in passes:
        assert (event["machines_listed"], event["machines_cleared"]) == (COUNT + 1, COUNT)
        assert event["findings"] == 1 and event["breaker"]["known"] == COUNT + 1
    found = {e["machine_id"] for e in events.of_kind("orphan_detected")}
    assert found == {"i-stray"}
