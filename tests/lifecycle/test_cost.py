"""Cost from the facts (issue 20 item 6) through the real loop, executor and gate on MockClock: each instance fact
carries the quote its machine was chosen at, returns carry when they were confirmed, and the estimate (the
``provisionerd cost`` report and the status document's cost lines, which ``provisionerd_estimated_spend_total``
integrates) match the facts."""

from __future__ import annotations

import trio
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.model import HostStatus, InstanceFact, RequestIntent, Returned
from provisionerd.planner.cost import estimate
from provisionerd.planner.policy import Policy
from provisionerd.testing.fake_provider import FakeProvider


def test_the_estimate_is_the_quote_times_the_hours_of_each_machine_as_the_facts_say(run_rig):
    seen: dict = {}
    provider = FakeProvider("p", {"small": 10}, launch_time=int(BASE), prices={"small": 0.25})
    policy = Policy(cluster=CLUSTER, idle_time=600.0, join_deadline=900.0, provisioning_timeout=600.0)

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 3))
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 3)
        for machine_id in list(rig.session.view.facts.machines):
            rig.join(machine_id, HostStatus.IDLE)
        await trio.sleep(3600)
        rig.session.set_demand(2, item("d", 1))  # two go after idle_time (600 s), one stays
        await rig.wait_for(lambda: len(rig.facts(Returned)) >= 1, limit=2000)
        await trio.sleep(100)
        seen["now"] = BASE + trio.current_time()
        seen["report"] = estimate(rig.session.view.facts.machines.values(), seen["now"])

    rig = run_rig(scenario, {"p": provider}, policy=policy)
    made = rig.facts(InstanceFact)
    assert {(f.price.amount, f.price.currency, f.price.unit) for f in made} == {(0.25, "USD", "hour")}
    assert {i.price for i in rig.facts(RequestIntent)} == {made[0].price}
    ended = {m: r.at for r in rig.facts(Returned) for m in r.machine_ids}
    assert len(ended) == 2 and all(at > BASE for at in ended.values())
    expected = sum(f.price.amount * (ended.get(f.machine_id, seen["now"]) - f.launch_time) / 3600 for f in made)
    report = seen["report"]
    (line,) = report.lines
    assert (line.provider, line.template_id, line.currency, line.machines) == ("p", "small", "USD", 3)
    assert abs(report.totals()["USD"] - expected) < 1e-4 and expected > 0.25 * 3  # more than an hour each
    assert (report.unpriced, report.other_unit, report.no_time) == (0, 0, 0)
