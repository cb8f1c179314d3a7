"""Adaptive scale-up through the real daemon (issue 18 item 6): a demand jump from 0 to 1,000 is served within
3 minutes with the default config, and a capacity or throttling refusal halves the step.

The real ``DaemonCore`` (session, lease keeper, gate, executor, reconcile loop) against the reference controller
over in-memory streams, on MockClock, with the in-memory provider answering every call after ``LATENCY`` virtual
seconds. The config is the default one but for ``max_machines`` (its default, 100, would cap the jump at 100) and
the controller link's test timings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from rigs.memory import memory_config, memory_core, running, sim_provider

from provisionerd.config.loader import Config
from provisionerd.domain.errors import Throttled
from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.metrics_snapshot import SnapshotCollector
from provisionerd.testing.fake_provider import FakeProvider

BASE_TIME = 1_800_000_000
LATENCY = 0.5


def config(tmp_path: Path, addresses) -> Config:
    return memory_config(tmp_path, addresses, sim_provider(tmp_path, max_machines=1000))


def run_jump(tmp_path, memory_controller, *, throttle_at: int | None = None) -> dict:
    events = EventLog(keep=200_000)
    fake = FakeProvider("sim", {"small": 5000}, latency=LATENCY, launch_time=BASE_TIME)
    seen: dict = {"served": None}
    throttle = [throttle_at]

    async def main():
        async with memory_controller(replicas=1) as net:
            core = memory_core(
                net, config(tmp_path, net.addresses), fake, events=events, wall=lambda: BASE_TIME + trio.current_time()
            )
            assert core.config.providers[0].step_limit == 10  # the default
            async with running(core):
                await trio.sleep(30)  # joined, lease held, offers read: the daemon at rest, nothing wanted

                def facts(kind: type) -> list:
                    return [c.fact for c in net.server.cluster.store.all_facts() if isinstance(c.fact, kind)]

                def made() -> int:
                    return len(facts(InstanceFact))

                start = trio.current_time()
                seen["status_before"] = core.status()["providers"]["sim"]["step"]
                net.server.cluster.set_demand([DemandItem("d1", ResourceShape(ncpus=1), 1000)])
                net.server.broadcast_demand()
                with trio.move_on_after(600):
                    while made() < 1000:
                        if throttle[0] is not None and made() >= throttle[0]:
                            fake.fail_next("requestMachines", Throttled("sim", "requestMachines", "slow down"))
                            throttle[0] = None
                        await trio.sleep(0.25)
                    seen["served"] = trio.current_time() - start
                seen["requested"] = sum(f.count for f in facts(RequestIntent))
                seen["status_after"] = core.status()["providers"]["sim"]["step"]
                seen["gauge"] = [
                    sample.value
                    for family in SnapshotCollector(core.status).collect()
                    if family.name == "provisionerd_provider_step"
                    for sample in family.samples
                ]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    seen["steps"] = [(e["old"], e["new"], e["reason"]) for e in events.of_kind("step_changed")]
    return seen


@pytest.mark.sweep
def test_a_demand_jump_from_0_to_1000_is_served_within_3_minutes_with_the_default_step(tmp_path, memory_controller):
    seen = run_jump(tmp_path, memory_controller)
    assert seen["served"] is not None and seen["served"] <= 180.0, seen["served"]
    assert seen["requested"] == 1000  # never above max_machines
    # The step started at the configured 10 and doubled per accepted round up to max_machines.
    assert seen["steps"] == [
        (10, 20, "accepted"),
        (20, 40, "accepted"),
        (40, 80, "accepted"),
        (80, 160, "accepted"),
        (160, 320, "accepted"),
        (320, 640, "accepted"),
        (640, 1000, "accepted"),
    ]
    assert seen["status_before"] == {"step": 10, "floor": 10, "cap": 1000, "interval_s": 60.0, "reason": "start"}
    assert seen["status_after"]["step"] == 1000 and seen["status_after"]["reason"] == "accepted"
    assert seen["gauge"] == [1000.0]  # provisionerd_provider_step{provider="sim"}


@pytest.mark.sweep
def test_a_throttled_request_halves_the_step_and_the_jump_is_still_served(tmp_path, memory_controller):
    seen = run_jump(tmp_path, memory_controller, throttle_at=70)
    assert seen["served"] is not None and seen["served"] <= 180.0, seen["served"]
    halved = [s for s in seen["steps"] if s[2] == "throttled"]
    assert len(halved) == 1 and halved[0][1] == halved[0][0] // 2
    assert seen["steps"][0] == (10, 20, "accepted")
