"""A return the provider keeps refusing is retried with the same op_id, backing off, and said to be stuck."""

from __future__ import annotations

from itertools import pairwise

from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, item

from provisionerd.domain.errors import ProviderRejected
from provisionerd.domain.model import HostStatus, InstanceFact, Returned, ReturnIntent
from provisionerd.execution.loop import LoopSettings

REFUSALS = 5


def test_a_refused_return_backs_off_exponentially_then_completes(run_rig):
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    for _ in range(REFUSALS):
        provider.fail_next(
            "requestReturnMachines", ProviderRejected("p", "requestReturnMachines", "internal", "api said no")
        )
    settings = LoopSettings(
        replan_interval=1.0, reclaim_interval=30.0, recover_after=30.0, return_retry_max=400.0, return_stuck_after=3
    )

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 1)
        for fact in rig.facts(InstanceFact):
            rig.join(fact.machine_id, HostStatus.IDLE)
        rig.session.set_demand(2, item("d", 0))
        await rig.wait_for(lambda: rig.facts(Returned), limit=5_000.0)

    rig = run_rig(scenario, {"p": provider}, loop_settings=settings)
    calls = [t for t, action in rig.providers["p"].call_log if action == "requestReturnMachines"]
    assert len(calls) == REFUSALS + 1
    assert len({f.op_id for f in rig.facts(ReturnIntent)}) == 1  # one op_id from first call to last
    gaps = [b - a for a, b in pairwise(calls)]
    # recover_after (30 s), then doubling, capped at return_retry_max (400 s); the loop looks every second.
    for gap, base in zip(gaps, [30, 60, 120, 240, 400], strict=True):
        assert base <= gap <= base + 1.0, (gaps, base)
    stuck = rig.events_of("return_stuck")
    assert [e["failures"] for e in stuck] == [3, 4, 5]
    assert stuck[0]["status"] == "rejected" and "api said no" in stuck[0]["detail"] and stuck[0]["retry_in"] == 120.0
    assert rig.loop.operations.failing_returns() == {}  # the success forgot the failures
    assert rig.providers["p"].machines[rig.facts(Returned)[0].machine_ids[0]]["status"] == "terminated"
