"""Hard max TTL with drain (issue 20, item 4) through the real loop, executor and gate on MockClock: a busy
machine past ``max_ttl`` is asked to drain at its ``max_ttl`` (the loop wakes for it), then returned when it goes
idle or at ``drain_timeout``, whichever comes first; its item gets a replacement meanwhile."""

from __future__ import annotations

import trio
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.model import DrainRequested, HostStatus, RequestIntent, ReturnIntent
from provisionerd.execution.loop import LoopSettings, ReconcileLoop
from provisionerd.planner.deadlines import PLAN_SLACK
from provisionerd.planner.policy import Policy
from provisionerd.testing.fake_provider import FakeProvider

MAX_TTL, DRAIN_TIMEOUT = 1000.0, 500.0


def policy() -> Policy:
    return Policy(
        cluster=CLUSTER,
        idle_time=300.0,
        join_deadline=10_000.0,  # the fake provider stamps every machine launched at BASE: no never_joined
        provisioning_timeout=600.0,
        max_ttl=MAX_TTL,
        drain_timeout=DRAIN_TIMEOUT,
    )


async def busy_until_drained(rig, seen):
    """Demand 1; the machine joins busy at once; wait for its drain."""
    rig.session.set_demand(1, item("d", 1))
    await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 1)
    (machine_id,) = rig.session.view.facts.machines
    rig.join(machine_id, HostStatus.BUSY)
    seen["machine"] = machine_id
    seen["drained_at"] = await rig.wait_for(lambda: bool(rig.facts(DrainRequested)))
    return machine_id


def test_idle_first_a_draining_machine_is_returned_when_it_goes_idle(run_rig):
    seen: dict = {}
    provider = FakeProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        machine_id = await busy_until_drained(rig, seen)
        await trio.sleep(200)  # busy, draining: nothing is returned
        seen["returns_while_busy"] = list(rig.facts(ReturnIntent))
        seen["requests_while_busy"] = len(rig.facts(RequestIntent))
        rig.join(machine_id, HostStatus.IDLE)
        seen["idle_at"] = trio.current_time()
        seen["returned_at"] = await rig.wait_for(lambda: bool(rig.facts(ReturnIntent)))
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, policy=policy())
    (drain,) = rig.facts(DrainRequested)
    assert drain.machine_ids == (seen["machine"],) and drain.reason == "max_ttl"
    # The machine launched at BASE (virtual 0): asked at its max_ttl, within the plan's slack.
    assert MAX_TTL <= seen["drained_at"] <= MAX_TTL + PLAN_SLACK
    assert drain.at == BASE + seen["drained_at"]
    assert seen["returns_while_busy"] == []
    assert seen["requests_while_busy"] == 2  # the replacement for the draining machine
    (ret,) = rig.facts(ReturnIntent)
    assert ret.machine_ids == (seen["machine"],) and ret.reason == "drained"
    assert seen["returned_at"] - seen["idle_at"] <= 1.0  # the host change wakes the loop
    assert seen["returned_at"] < seen["drained_at"] + DRAIN_TIMEOUT


def test_drain_timeout_first_a_machine_still_busy_is_returned_anyway(run_rig):
    seen: dict = {}
    provider = FakeProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        await busy_until_drained(rig, seen)
        seen["returned_at"] = await rig.wait_for(lambda: bool(rig.facts(ReturnIntent)))
        await rig.wait_for(lambda: rig.calls("p", "requestReturnMachines") != [])
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, policy=policy())
    (ret,) = rig.facts(ReturnIntent)
    assert ret.machine_ids == (seen["machine"],) and ret.reason == "drain_timeout"
    # The loop woke at the drain deadline (not at the next replan tick): exact to the plan's slack.
    (drain,) = rig.facts(DrainRequested)
    deadline = drain.at - BASE + DRAIN_TIMEOUT
    assert deadline <= seen["returned_at"] <= deadline + PLAN_SLACK
    assert seen["machine"] not in {m["machineId"] for m in rig.running("p")}


def test_a_resync_after_a_lost_link_neither_loses_the_drain_nor_returns_early(run_rig):
    """The session rejoins (a new view from the controller's facts alone, hosts and demand later): the drain is in
    the facts, so it is not asked again and its deadline is the first one."""
    seen: dict = {}
    provider = FakeProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        machine_id = await busy_until_drained(rig, seen)
        await trio.sleep(100)
        rig.session.rejoin(list(rig.controller.facts))
        await trio.sleep(5)  # no hosts, no demand yet: the machine counts as not joined, it is not due
        rig.join(machine_id, HostStatus.BUSY)
        rig.session.set_demand(1, item("d", 1))
        seen["returned_at"] = await rig.wait_for(lambda: bool(rig.facts(ReturnIntent)))
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, policy=policy())
    assert len(rig.facts(DrainRequested)) == 1
    (ret,) = rig.facts(ReturnIntent)
    assert ret.reason == "drain_timeout"
    deadline = seen["drained_at"] + DRAIN_TIMEOUT
    assert deadline - PLAN_SLACK <= seen["returned_at"] <= deadline + PLAN_SLACK


def test_a_restarted_loop_keeps_the_drain_from_the_facts_and_its_first_deadline(run_rig):
    """The daemon restarts while the machine drains: the new process's planner remembers nothing, reads the drain
    from the facts, does not ask again, and returns the machine at the first drain's deadline, not a later one."""
    seen: dict = {}
    provider = FakeProvider("p", {"small": 10}, launch_time=int(BASE))

    async def scenario(rig, nursery):
        async with trio.open_nursery() as first:
            await first.start(rig.loop.run)
            await busy_until_drained(rig, seen)
            await trio.sleep(100)
            first.cancel_scope.cancel()  # the process dies
        again = ReconcileLoop(
            rig.session,
            rig.keepers,
            rig.executor,
            rig.feed,
            rig.policy,
            rig.events,
            settings=LoopSettings(replan_interval=10.0, reclaim_interval=30.0, recover_after=30.0),
            wall=lambda: BASE + trio.current_time(),
            incarnation="i2",
            jitter_seed=3,
            feedback=rig.feedback.receive,
        )
        rig.session.rejoin(list(rig.controller.facts))
        rig.join(seen["machine"], HostStatus.BUSY)
        rig.session.set_demand(1, item("d", 1))
        await nursery.start(again.run)
        seen["returned_at"] = await rig.wait_for(lambda: bool(rig.facts(ReturnIntent)))
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, loop=False, policy=policy())
    assert len(rig.facts(DrainRequested)) == 1  # not asked again by the new process
    (ret,) = rig.facts(ReturnIntent)
    assert ret.reason == "drain_timeout" and ret.op_id.split(":")[2] == "i2"
    deadline = seen["drained_at"] + DRAIN_TIMEOUT
    assert deadline - PLAN_SLACK <= seen["returned_at"] <= deadline + PLAN_SLACK
