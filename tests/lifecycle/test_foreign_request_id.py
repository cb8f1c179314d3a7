"""A plugin answering a requestId it never made, through the real loop, gate, executor and recovery on MockClock
(issue 31, finding 3; the real-process form is ``test_foreign_request_id_real.py``).

The fake makes the machines (only ``make`` of them) and answers ``req-ffffffffffff``, which its status call reports
as an unknown request. The op's listing is committed; a shortfall keeps the intent open, so no second request is
made for the demand until recovery has listed the op again and failed the rest; the second violation in a row makes
the provider unhealthy with a reason naming the id. No machine is ever without its fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, item

from provisionerd.domain.model import HostStatus, InstanceFact, RequestFailed, RequestIntent, Returned, ReturnIntent

FOREIGN = "req-ffffffffffff"


class ForeignIds(BootingProvider):
    def _requestMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        super()._requestMachines(doc)
        return {"requestId": FOREIGN, "message": "requested"}


def test_a_foreign_id_keeps_the_op_open_until_recovery_and_twice_in_a_row_is_unhealthy(run_rig):
    p = ForeignIds("p", {"small": 50}, launch_time=int(BASE), make=1)
    seen: dict[str, Any] = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d1", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 1)
        first = trio.current_time()
        await trio.sleep(20)  # before recover_after (30 s): the op is open, its demand counted as under way
        seen["requests_while_open"] = len(rig.calls("p", "requestMachines"))
        seen["intents_while_open"] = len(rig.facts(RequestIntent))
        await rig.wait_for(lambda: rig.loop.unhealthy("p"))
        seen["unhealthy_after"] = trio.current_time() - first
        seen["health"] = rig.loop.provider_health()["p"]
        seen["failed"] = rig.facts(RequestFailed)
        seen["facts"] = {f.machine_id for f in rig.facts(InstanceFact)}
        seen["machines"] = set(p.machines)

    rig = run_rig(scenario, {"p": p})
    assert seen["requests_while_open"] == 1 and seen["intents_while_open"] == 1
    # The first op failed by recovery (its listing: 1 of 3), the shortfall requested once more, foreign again.
    assert len(seen["failed"]) >= 1 and "1 of 3" in seen["failed"][0].reason
    assert seen["unhealthy_after"] >= 30.0
    health = seen["health"]
    assert health["state"] == "unhealthy" and health["code"] == "protocol_violation"
    assert FOREIGN in health["detail"]
    assert health["returns_wait"] is False
    assert seen["machines"] == seen["facts"]  # every machine made has its fact
    (unhealthy,) = rig.events_of("provider_unhealthy", provider="p")
    assert FOREIGN in unhealthy["detail"]


class ForeignReturnIds(BootingProvider):
    """Returns for real, then answers a requestId its status call does not know."""

    def _requestReturnMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        super()._requestReturnMachines(doc)
        return {"requestId": FOREIGN_RETURN, "message": "returning"}


FOREIGN_RETURN = "ret-ffffffffffff"


def test_a_foreign_return_id_leaves_the_return_open_and_twice_in_a_row_is_unhealthy_naming_both_ids(run_rig):
    """The return's outcome is unknown, never "returned": no ``Returned`` fact, the machine stays returning and the
    loop resumes the same op_id; the second violation in a row makes the provider unhealthy, its reason naming the id
    the plugin answered and the call that answered it."""
    p = ForeignReturnIds("p", {"small": 10}, launch_time=int(BASE))
    seen: dict[str, Any] = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 1)
        for fact in rig.facts(InstanceFact):
            rig.join(fact.machine_id, HostStatus.IDLE)
        rig.session.set_demand(2, item("d", 0))
        await rig.wait_for(lambda: rig.loop.unhealthy("p"), limit=5_000.0)
        seen["health"] = rig.loop.provider_health()["p"]
        seen["returned"] = rig.facts(Returned)
        seen["return_ops"] = {f.op_id for f in rig.facts(ReturnIntent)}
        seen["calls"] = len(rig.calls("p", "requestReturnMachines"))

    run_rig(scenario, {"p": p})
    assert seen["returned"] == [] and len(seen["return_ops"]) == 1  # one op, resumed, never called returned
    assert seen["calls"] == 2
    health = seen["health"]
    assert health["code"] == "protocol_violation" and health["returns_wait"] is False
    assert FOREIGN_RETURN in health["detail"] and "requestReturnMachines" in health["detail"]
