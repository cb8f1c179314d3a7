"""``daemon.explain_admin``: ``explain`` and ``plan_what_if`` plan on copies of the live inputs and change nothing;
a big view is planned in a worker thread and planned again when the loop changed it meanwhile; a what-if document
comes in parts; and the daemon's copy of the demand schema is the reference controller's."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio

from provisionerd.config.demand_doc import parse_demand
from provisionerd.controller.lease import LeaseState, LeaseStatus
from provisionerd.controller.view import ControllerView
from provisionerd.daemon import explain_admin
from provisionerd.daemon.explain_admin import Explainer, Sources
from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    DemandSnapshot,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    Offer,
    PriceQuote,
    RequestIntent,
    ResourceShape,
)
from provisionerd.planner.capacity import Unhealthy
from provisionerd.planner.fact_view import FactView, fold
from provisionerd.planner.in_flight import NOTHING_IN_FLIGHT
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.rejoin import Rejoin
from provisionerd.planner.state import PlannerState

NOW = 1_800_000_000.0
EPOCH = Epoch(1, 1)
OFFER = Offer("p", "t", 100, {"ncpus": ("Numeric", "4"), "ngpus": ("Numeric", "0")}, None)


@attrs.define
class FakeLoop:
    state: PlannerState = attrs.field(factory=lambda: PlannerState.initial("t"))
    policy: Policy = attrs.field(factory=lambda: Policy(cluster="c", providers={"p": ProviderPolicy(max_machines=5)}))
    rejoin: Rejoin = Rejoin(float("-inf"), frozenset())
    leased_now: list[str] = ["p"]

    def leased(self) -> list[str]:
        return self.leased_now

    def settle_windows(self) -> dict[str, dict[str, Any]]:
        return {}


def _view(n: int, *items: DemandItem) -> ControllerView:
    """``n`` busy machines of item ``cpu`` at provider ``p``."""
    view = FactView()
    refs = tuple(f"ref-{i}" for i in range(n))
    facts = [CommittedFact(1, RequestIntent("p", EPOCH, "op", "t", n, refs, ("0" * 64,) * n, "cpu"))]
    for i, ref in enumerate(refs):
        facts.append(CommittedFact(i + 2, InstanceFact("p", EPOCH, "op", ref, f"m{i}", "t", "0" * 64, NOW - 60)))
        view.hosts[ref] = HostState(ref, "p", f"m{i}", HostStatus.BUSY, NOW - 30)
    fold(facts, view)
    return ControllerView(1, "primary", 1, view, view.hosts, DemandSnapshot(1, items))


def _explainer(view: ControllerView, loop: FakeLoop) -> Explainer:
    sources = Sources(
        view=lambda: view,
        loop=loop,
        in_flight=lambda: NOTHING_IN_FLIGHT,
        offers=lambda: [OFFER],
        leases={},
        guard_status=lambda: {"halted": False},
        wall=lambda: NOW,
    )
    return Explainer(sources)


CPU, GPU = DemandItem("cpu", ResourceShape(ncpus=4), 8), DemandItem("gpu", ResourceShape(gpus=1), 1)


def test_explain_gives_each_item_its_own_reason_and_changes_nothing():
    view, loop = _view(5, CPU, GPU), FakeLoop()
    before = (loop.state, view.version, dict(view.facts.machines))
    reply = trio.run(_explainer(view, loop).answer, None, None)
    items = {i["demand_id"]: i for i in reply["items"]}
    assert items["cpu"]["summary"] == "max_machines 5/5 (provider cap reached)"
    assert items["gpu"]["summary"] == "no template offers gpus >= 1"
    assert reply["actions"] == [] and reply["what_if"] is False
    assert (loop.state, view.version, dict(view.facts.machines)) == before


def test_a_big_view_is_planned_in_a_thread_and_again_when_it_changed_meanwhile(monkeypatch):
    monkeypatch.setattr(explain_admin, "INLINE", 0)
    view, loop = _view(5, CPU, GPU), FakeLoop()
    calls = []
    real = trio.to_thread.run_sync

    async def changing(fn, *args):
        calls.append(fn)
        result = await real(fn, *args)
        if len(calls) == 1:
            view.version += 1  # the loop folded a fact while the thread planned
        return result

    monkeypatch.setattr(explain_admin.trio.to_thread, "run_sync", changing)
    what_if = (DemandItem("cpu", ResourceShape(ncpus=4), 3),)
    reply = trio.run(_explainer(view, loop).answer, what_if, None)
    assert len(calls) == 2
    items = {i["demand_id"]: i for i in reply["items"]}
    # 5 busy machines for a hypothetical 3: nothing returned while busy, and nothing requested
    assert (items["cpu"]["wanted"], items["cpu"]["supplied"], items["cpu"]["surplus_busy"]) == (3, 5, 5)
    assert reply["what_if"] is True and reply["actions"] == []


def test_what_if_documents_come_in_parts_and_a_bad_one_is_refused_with_its_path():
    view, loop = _view(0, CPU), FakeLoop()
    explainer = _explainer(view, loop)
    command = explainer.what_if_command()
    text = json.dumps([{"demand_id": "more", "shape": {"ncpus": 4}, "count": 2}])

    async def main():
        first = await command.run({"part": text[:10], "more": True}, 0)
        last = await command.run({"part": text[10:], "more": False, "upload": first["upload"]}, 0)
        bad = await command.run({"part": '[{"demand_id": "x", "shape": {}, "count": "2"}]'}, 0)
        gone = await command.run({"part": "x", "more": False, "upload": first["upload"]}, 0)
        return last, bad, gone

    last, bad, gone = trio.run(main)
    assert last["actions"][0].startswith("request 2 x p/t for more")
    assert bad["ok"] is False and "$[0].count" in bad["error"]
    assert gone["ok"] is False and "upload expired or unknown" in gone["error"]


def test_a_demand_document_reads_as_the_reference_controller_stores_demand():
    """The document reader builds the same items the controller's stored form (``refcontroller.jsonconv``) gives."""
    from refcontroller.jsonconv import demand_items_from_json

    text = json.dumps(
        [
            {"demand_id": "a", "shape": {"ncpus": 2, "attributes": {"zone": "x"}}, "count": 3},
            {
                "demand_id": "b",
                "shape": {},
                "count": 1,
                "max_hourly_cost": 2,
                "providers": ["p"],
                "placement": {"rack": "1"},
                "reservation": "r",
                "release": "on_completion",
                "cost_currency": "EUR",
            },
        ]
    )
    assert parse_demand(text) == demand_items_from_json(text)


@pytest.mark.parametrize("only", ["nosuch", ""])
def test_explain_refuses_an_unknown_item(only):
    view, loop = _view(0, CPU), FakeLoop()
    reply = trio.run(_explainer(view, loop).explain_command().run, {"demand_id": only}, 0)
    assert reply["ok"] is False


@attrs.frozen
class StandbyKeeper:
    def status(self, now: float) -> LeaseStatus:
        return LeaseStatus("p", LeaseState.LAPSED, None, None, "held by prov-b")


def test_gates_name_a_halt_a_standby_provider_and_an_unhealthy_one_since_when():
    view, loop = _view(0, CPU), FakeLoop()
    sick = Unhealthy("auth_failed", "bad key", NOW - 50, 2, NOW + 10)
    loop.state = attrs.evolve(loop.state, capacity=attrs.evolve(loop.state.capacity, unhealthy={"p": sick}))
    reply = trio.run(_explainer(view, loop).answer, None, None)
    (cpu,) = reply["items"]
    assert cpu["offers"][0]["verdict"] == "blocked"
    assert cpu["offers"][0]["reasons"][-1] == f"unhealthy since {NOW - 50:.1f}"
    assert any(
        "unhealthy (auth_failed: bad key)" in gate and f"since {NOW - 50:.1f}" in gate for gate in reply["gates"]
    )
    standby = FakeLoop(leased_now=[])
    sources = attrs.evolve(
        _explainer(view, standby)._sources,
        leases={"p": StandbyKeeper()},
        guard_status=lambda: {"halted": True, "finding": "incarnation changed"},
    )
    reply = trio.run(Explainer(sources).answer, None, None)
    (cpu,) = reply["items"]
    assert [(o["verdict"], list(o["reasons"])) for o in cpu["offers"]] == [
        ("not_leased", ["provider 'p': lease lapsed (held by prov-b): standby, no request goes there from here"])
    ]
    assert cpu["summary"].startswith("no offers: the lease of their providers is not held here")
    assert reply["gates"][0].startswith("halted (controller amnesia)") and "incarnation changed" in reply["gates"][0]


def test_what_if_chooses_offers_in_the_loops_order_provider_priority_first():
    cheap_cloud = Offer("q", "t", 100, {"ncpus": ("Numeric", "4")}, PriceQuote(0.01, "USD", "hour", "test", ""))
    policy = Policy(cluster="c", providers={"p": ProviderPolicy(max_machines=5), "q": ProviderPolicy(priority=1)})
    view, loop = _view(0, CPU), FakeLoop(policy=policy, leased_now=["p", "q"])
    sources = attrs.evolve(_explainer(view, loop)._sources, offers=lambda: [OFFER, cheap_cloud])
    what_if = (DemandItem("more", ResourceShape(ncpus=4), 7),)
    reply = trio.run(Explainer(sources).answer, what_if, None)
    # p (priority 0) first up to its cap of 5, though q is cheaper; the rest at q
    assert [a.split(" (")[0] for a in reply["actions"]] == ["request 5 x p/t for more", "request 2 x q/t for more"]


def test_the_metrics_count_the_cap_and_the_missing_gpu_apart():
    """The planner names the rules where it makes the reasons (``planner.unmet_rules``); the counter reads them from
    the ``plan_note`` event, never from the note's text."""
    from prometheus_client.parser import text_string_to_metric_families

    from provisionerd.planner.allocate import Allocator
    from provisionerd.planner.offers import Catalog
    from provisionerd.planner.state import PlannerState
    from provisionerd.planner.supply import Tally
    from provisionerd.telemetry.metrics import DaemonMetrics

    policy = Policy(cluster="c", step_limit=100, providers={"p": ProviderPolicy(max_machines=10)})
    counts = Tally(load={("p", "t"): 10}, provider_loads={"p": 10})  # at the cap
    allocator = Allocator(PlannerState.initial("i"), Catalog([OFFER]), counts, 0.0, policy)
    notes: list = []
    allocator.serve(DemandItem("cap", ResourceShape(ncpus=1), 5), {}, notes)
    allocator.serve(DemandItem("gpu", ResourceShape(gpus=1), 1), {}, notes)
    assert [(n.demand_id, n.rules) for n in notes] == [("cap", ("max_machines",)), ("gpu", ("incompatible",))]
    metrics = DaemonMetrics(lambda: {})
    for note in notes:
        metrics.events.add({"event": "plan_note", "kind": "unmet_demand", "detail": "...", "rules": list(note.rules)})
    metrics.events.add({"event": "plan_note", "kind": "unmet_demand", "detail": "max_machines 3/3"})  # no rules
    metrics.events.add({"event": "plan_note", "kind": "deferred", "rules": ["max_machines"]})  # not an unmet note
    counted = {
        s.labels["rule"]: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "provisionerd_unmet_demand_rules_total"
    }
    assert counted == {"max_machines": 1.0, "incompatible": 1.0}
