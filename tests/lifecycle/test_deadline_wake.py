"""The reconcile loop wakes at the next deadline the planner knows of, not at its next tick (issue 18 item 6).

The lifecycle rig on MockClock (the real lease keepers, gate, executor, offer feed and reconcile loop against a fake
controller and the in-memory provider): the times asserted are virtual and exact up to the loop's half second of
coalescing (``planner.deadlines.PLAN_SLACK``).
"""

from __future__ import annotations

from typing import Any

import trio
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.model import HostStatus, InstanceFact, ReturnIntent
from provisionerd.planner.policy import Policy
from provisionerd.testing.fake_provider import FakeProvider

#: Not a multiple of the 10 s replan interval: a loop that only ticked would return the machine 6.3 s late.
IDLE_TIME = 303.7


class TimedProvider(FakeProvider):
    """Records the virtual time each call starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[tuple[str, float]] = []

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        self.started.append((action, trio.current_time()))
        return await super().call(action, input, timeout=timeout)


def test_an_idle_machine_is_returned_within_a_second_of_its_idle_time(run_rig):
    seen: dict = {}
    provider = TimedProvider("p", {"small": 10}, launch_time=int(BASE))
    policy = Policy(cluster=CLUSTER, idle_time=IDLE_TIME, join_deadline=900.0, provisioning_timeout=600.0)

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 1)
        await trio.sleep(7.9)  # off the loop's tick phase
        (made,) = rig.facts(InstanceFact)
        rig.join(made.machine_id, HostStatus.IDLE)
        seen["idle_since"] = trio.current_time()
        await trio.sleep(2.3)
        rig.session.set_demand(2, item("d", 0))  # not needed any more: it goes once idle for IDLE_TIME
        await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) == 1)
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, policy=policy)
    (returned_at,) = [t for action, t in provider.started if action == "requestReturnMachines"]
    late = returned_at - (seen["idle_since"] + IDLE_TIME)
    assert 0.0 <= late <= 1.0, late
    (ret,) = rig.facts(ReturnIntent)
    assert ret.reason == "idle"


def test_a_machine_that_never_joins_is_returned_within_a_second_of_its_join_deadline(run_rig):
    provider = TimedProvider("p", {"small": 10}, launch_time=int(BASE))  # launched at virtual time 0
    policy = Policy(cluster=CLUSTER, idle_time=300.0, join_deadline=123.4, provisioning_timeout=600.0)

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) == 1, limit=400.0)
        await trio.sleep(1)

    rig = run_rig(scenario, {"p": provider}, policy=policy)
    (returned_at,) = [t for action, t in provider.started if action == "requestReturnMachines"]
    assert 123.4 <= returned_at <= 124.4, returned_at
    (ret,) = rig.facts(ReturnIntent)
    assert ret.reason == "never_joined"
