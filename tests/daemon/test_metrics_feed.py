"""The metrics' feeds without a daemon: events into counters (bounded labels), one pass over a view into machines by
state and demand wanted/supplied, and the metered client's outcome labels."""

from __future__ import annotations

import threading
import types

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from provisionerd.controller.view import ControllerView
from provisionerd.daemon import status_snapshot
from provisionerd.daemon.metered import CallLog, MeteredClient, outcome_of
from provisionerd.domain.errors import ProviderTimeout, Throttled
from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    DemandSnapshot,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    PriceQuote,
    RequestIntent,
    ResourceShape,
    ReturnIntent,
)
from provisionerd.planner.fact_view import fold
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry import metrics as metrics_module
from provisionerd.telemetry.metrics import DaemonMetrics
from provisionerd.testing.fake_provider import FakeProvider


def samples(metrics: DaemonMetrics) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_events_become_counters_with_bounded_labels(monkeypatch):
    monkeypatch.setattr(metrics_module, "MAX_SERIES", 3)
    m = DaemonMetrics(lambda: {})
    for record in [
        {"event": "join", "generation": 1, "mono": 10.0},
        {"event": "link_up", "generation": 1},
        {"event": "resync", "generation": 1, "mono": 10.25},
        {"event": "link_down", "generation": 1},
        {"event": "link_up", "generation": 2},
        {"event": "refresh", "generation": 2},
        {"event": "gate", "provider": "sim", "fact": "RequestIntent", "outcome": "admitted"},
        {"event": "gate", "provider": "sim", "fact": "RequestIntent", "outcome": "finished"},
        {"event": "gate", "provider": "sim", "fact": "ReturnIntent", "outcome": "rejected", "detail": "stale"},
        {"event": "orphan_detected", "provider": "sim", "orphan_class": "tagged_unknown", "action": "report"},
        {"event": "lease_acquired", "provider": "sim"},
        {"event": "lease_denied", "provider": "bad provider name!"},  # not a name: counted as "other"
        {"event": "resync", "generation": [1]},  # junk: counted, no duration, no error
    ]:
        m.events.add(record)
    for i in range(5):  # more label sets than MAX_SERIES: the rest go under "other"
        m.calls.ended(f"p{i}", "listMachines", "ok", 0.01)
    s = samples(m)
    assert s[("provisionerd_link_reconnects_total", ())] == 1.0
    assert s[("provisionerd_link_breaks_total", ())] == 1.0
    assert s[("provisionerd_resyncs_total", (("kind", "join"),))] == 2.0
    assert s[("provisionerd_resyncs_total", (("kind", "refresh"),))] == 1.0
    assert s[("provisionerd_resync_duration_seconds_count", ())] == 1.0
    assert s[("provisionerd_resync_duration_seconds_sum", ())] == 0.25
    assert s[("provisionerd_intents_committed_total", (("kind", "RequestIntent"), ("provider", "sim")))] == 1.0
    refused = (
        "provisionerd_intents_refused_total",
        (("kind", "ReturnIntent"), ("provider", "sim"), ("reason", "rejected")),
    )
    assert s[refused] == 1.0
    finding = (("action", "report"), ("orphan_class", "tagged_unknown"), ("provider", "sim"))
    assert s[("provisionerd_orphan_findings_total", finding)] == 1.0
    assert s[("provisionerd_lease_events_total", (("event", "denied"), ("provider", "other")))] == 1.0
    calls = {dict(k[1])["provider"]: v for k, v in s.items() if k[0] == "provisionerd_provider_calls_total"}
    assert calls == {"p0": 1.0, "p1": 1.0, "p2": 1.0, "other": 2.0}


def test_one_pass_over_the_view_counts_machines_by_state_and_demand_by_offer():
    refs = [f"clu/op-1/{i}" for i in range(4)]
    facts = [
        RequestIntent("sim", Epoch(1, 1), "op-1", "small", 4, tuple(refs), ("a" * 64,) * 4, demand_id="d1"),
        *(
            InstanceFact("sim", Epoch(1, 1), "op-1", refs[i], f"m{i}", "small", "a" * 64, launch_time=100.0)
            for i in range(3)
        ),
        ReturnIntent("sim", Epoch(1, 1), "ret-1", ("m2",), "idle"),
    ]
    view = fold(CommittedFact(i + 1, f) for i, f in enumerate(facts))
    # m0 idle, m1 not joined (past its 60 s deadline), m2 returning; refs[3] has no instance fact yet but joined.
    view.hosts[refs[0]] = HostState(refs[0], "sim", "m0", HostStatus.IDLE, 0.0)
    view.hosts[refs[3]] = HostState(refs[3], "sim", "", HostStatus.BUSY, 0.0)
    controller = ControllerView(
        1, "ctl0", 1, view, view.hosts, DemandSnapshot(1, (DemandItem("d1", ResourceShape(), 5),))
    )
    pieces = types.SimpleNamespace(
        keepers={"sim": None},
        policy=Policy(cluster="clu", providers={"sim": ProviderPolicy(join_deadline=60.0)}),
    )
    fleet = status_snapshot._Fleet(controller, 1000.0, pieces)  # type: ignore[arg-type]
    assert dict(fleet.machines["sim"]) == {"idle": 1, "booting": 1, "returning": 1, "busy": 1}
    assert fleet.by_template("sim") == {"small": {"wanted": 3, "supplied": 2}}
    assert (fleet.wanted_total, fleet.unplaced) == (5, 2)
    assert fleet.readiness("sim") == {"state": "failed", "detail": "1 machine(s) past the join deadline"}


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "ok"),
        (Throttled("sim", "requestMachines", "slow down"), "throttled"),
        (ProviderTimeout("sim", "requestMachines", "60 s"), "timeout"),
        (ValueError("bug"), "error"),
    ],
)
def test_the_metered_client_reports_every_call_with_its_outcome(error, outcome):
    fake = FakeProvider("sim")
    calls = CallLog()
    client = MeteredClient(PluginClient(fake), calls)
    if error is not None:
        if isinstance(error, Throttled | ProviderTimeout):
            fake.fail_next("getAvailableTemplates", error)
        else:

            async def broken(*, timeout=None):
                raise error

            client.inner = types.SimpleNamespace(name="sim", get_available_templates=broken)  # type: ignore[assignment]

    async def main():
        await trio.sleep(1)
        try:
            await client.get_available_templates()
        except Exception as exc:  # noqa: BLE001 - the test checks it passed through unchanged
            assert exc is error

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert outcome_of(error) == outcome
    counted = {
        s.labels["outcome"]: s.value
        for family in calls.counters.calls.metric.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert counted == {outcome: 1.0}  # one call, counted once by the log's own counters
    assert calls.last["sim"].outcome == outcome and calls.last["sim"].at == 1.0
    assert ("sim" in calls.last_ok) is (outcome == "ok")


def _priced_view(machines: int, start: float) -> ControllerView:
    refs = [f"clu/op-1/{i}" for i in range(machines)]
    price = PriceQuote(0.5, "USD", "hour", "offer", "")
    facts = [
        RequestIntent(
            "sim", Epoch(1, 1), "op-1", "small", machines, tuple(refs), ("a" * 64,) * machines, demand_id="d1"
        ),
        *(
            InstanceFact(
                "sim",
                Epoch(1, 1),
                "op-1",
                refs[i],
                f"m{i}",
                "small",
                "a" * 64,
                launch_time=start + 7.0 * i,
                price=price,
            )
            for i in range(machines)
        ),
        ReturnIntent("sim", Epoch(1, 1), "ret-1", ("m2",), "idle"),
    ]
    view = fold(CommittedFact(i + 1, f) for i, f in enumerate(facts))
    view.hosts[refs[0]] = HostState(refs[0], "sim", "m0", HostStatus.IDLE, 0.0)
    return ControllerView(1, "ctl0", 1, view, view.hosts, DemandSnapshot(1, (DemandItem("d1", ResourceShape(), 5),)))


@pytest.mark.parametrize("now_offset", [-10.0, 0.0, 15.0, 3600.0, 86400.0 * 400])
def test_the_spend_curve_equals_the_cost_estimate_at_any_time(now_offset):
    start = 1.7e9
    view = _priced_view(40, start)
    now = start + now_offset
    curve = status_snapshot._Pass.of(status_snapshot._Parts.of(view)).spend.at(now)
    assert [{k: v for k, v in line.items() if k != "rate"} for line in curve] == status_snapshot._spend(view, now)


def test_a_status_query_walks_the_view_again_only_when_it_changed():
    view = _priced_view(6, 100.0)
    snapshot = _bare_snapshot(view)
    pieces = snapshot.pieces
    first = snapshot._pass(view)
    assert snapshot._pass(view) is first and snapshot.passes == 1
    # Machines booting past their deadline are counted at the time asked, from the pass made earlier.
    assert status_snapshot._Fleet(view, 150.0, pieces, first).overdue["sim"] == 0  # type: ignore[arg-type]
    assert status_snapshot._Fleet(view, 200.0, pieces, first).overdue["sim"] == 4  # type: ignore[arg-type]
    fresh = status_snapshot._Fleet(view, 200.0, pieces)  # type: ignore[arg-type]
    assert fresh.overdue == status_snapshot._Fleet(view, 200.0, pieces, first).overdue  # type: ignore[arg-type]
    view.apply_hosts([HostState("clu/op-1/1", "sim", "m1", HostStatus.BUSY, 0.0)])
    second = snapshot._pass(view)
    assert second is not first and snapshot.passes == 2
    assert status_snapshot._Fleet(view, 200.0, pieces, second).machines["sim"]["busy"] == 1  # type: ignore[arg-type]


def test_machines_asked_to_drain_are_counted_per_provider_in_status_and_a_gauge():
    """Issue 20 item 4: an operator sees how many active machines are draining (a ``DrainRequested`` fact names
    them); a returned one no longer counts; the gauge reads the status document."""
    from provisionerd.domain.model import DrainRequested
    from provisionerd.telemetry.metrics_snapshot import SnapshotCollector

    refs = [f"clu/op-1/{i}" for i in range(3)]
    facts = [
        RequestIntent("sim", Epoch(1, 1), "op-1", "small", 3, tuple(refs), ("a" * 64,) * 3, demand_id="d1"),
        *(
            InstanceFact("sim", Epoch(1, 1), "op-1", refs[i], f"m{i}", "small", "a" * 64, launch_time=100.0)
            for i in range(3)
        ),
        DrainRequested("sim", Epoch(1, 1), "drain-1", ("m0", "m1"), "max_ttl", 5000.0),
        ReturnIntent("sim", Epoch(1, 1), "ret-1", ("m1",), "drained"),
    ]
    view = fold(CommittedFact(i + 1, f) for i, f in enumerate(facts))
    controller = ControllerView(1, "ctl0", 1, view, view.hosts, DemandSnapshot(1, ()))
    pieces = types.SimpleNamespace(keepers={"sim": None}, policy=Policy(cluster="clu"))
    fleet = status_snapshot._Fleet(controller, 6000.0, pieces)  # type: ignore[arg-type]
    assert dict(fleet.draining) == {"sim": 1}  # m0; m1 is returning, m2 was never asked
    held = {"lease": {"state": "held"}}  # the fleet gauges are the lease holder's (metrics_snapshot)
    doc = {"providers": {"sim": {"draining": 1, **held}, "other": held}, "drains_refused": 2}
    got = {
        (s.name, s.labels.get("provider", "")): s.value
        for family in SnapshotCollector(lambda: doc).collect()
        for s in family.samples
        if s.name in ("provisionerd_machines_draining", "provisionerd_drains_refused_total")
    }
    assert got == {
        ("provisionerd_machines_draining", "sim"): 1.0,
        ("provisionerd_machines_draining", "other"): 0.0,
        ("provisionerd_drains_refused_total", ""): 2.0,
    }


def fleet_samples(doc: dict) -> dict:
    m = DaemonMetrics(lambda: doc)
    return {k: v for k, v in samples(m).items() if k[0].startswith(("provisionerd_demand_", "provisionerd_machines"))}


def test_demand_series_read_0_once_the_demand_no_longer_names_them():
    """issue 32 item 6: a template's demand series does not vanish when its demand goes to 0."""
    doc: dict = {
        "providers": {
            "sim": {"lease": {"state": "held"}, "demand": {"by_template": {"small": {"wanted": 3, "supplied": 2}}}}
        }
    }
    m = DaemonMetrics(lambda: doc)
    wanted = ("provisionerd_demand_wanted_machines", (("provider", "sim"), ("template", "small")))
    supplied = ("provisionerd_demand_supplied_machines", (("provider", "sim"), ("template", "small")))
    assert samples(m)[wanted] == 3.0 and samples(m)[supplied] == 2.0
    doc["providers"]["sim"]["demand"] = {"by_template": {}}  # demand 0: the status names the template no more
    assert samples(m)[wanted] == 0.0 and samples(m)[supplied] == 0.0


def test_only_the_lease_holder_exports_a_providers_fleet_gauges():
    """issue 32 item 6: both daemons of an HA pair see the whole fleet; only the holder exports it."""
    entry = {"machines": {"idle": 4, "busy": 6}, "demand": {"by_template": {"small": {"wanted": 10, "supplied": 10}}}}
    holder = fleet_samples({"providers": {"sim": {**entry, "lease": {"state": "held"}}}})
    standby = fleet_samples({"providers": {"sim": {**entry, "lease": {"state": "none", "standby": True}}}})
    assert holder[("provisionerd_machines", (("provider", "sim"), ("state", "busy")))] == 6.0
    assert sum(v for (name, _), v in holder.items() if name == "provisionerd_machines") == 10.0
    assert standby == {}  # the standby's share of a sum over the pair is nothing


def test_build_info_and_process_metrics_are_on_the_private_registry():
    from provisionerd import __version__

    s = samples(DaemonMetrics(lambda: {}))
    (build,) = [labels for (name, labels) in s if name == "provisionerd_build_info"]
    assert dict(build)["version"] == __version__ and s[("provisionerd_build_info", build)] == 1.0
    assert s[("process_start_time_seconds", ())] > 0  # a "daemon restarted" rule reads this
    assert ("process_resident_memory_bytes", ()) in s and ("process_open_fds", ()) in s


def _bare_snapshot(view: ControllerView) -> status_snapshot.StatusSnapshot:
    pieces = types.SimpleNamespace(
        keepers={},
        policy=Policy(cluster="clu", providers={"sim": ProviderPolicy(join_deadline=60.0)}),
        session=types.SimpleNamespace(view=view),
    )
    snapshot = status_snapshot.StatusSnapshot.__new__(status_snapshot.StatusSnapshot)
    snapshot.pieces, snapshot._cached, snapshot.passes, snapshot.pass_seconds = pieces, None, 0, 0.0  # type: ignore[assignment]
    snapshot.passes_off_loop = 0
    return snapshot


def test_a_large_views_status_pass_is_made_off_the_loop_and_stands_for_the_view_a_second_while_it_changes(
    monkeypatch,
):
    view = _priced_view(status_snapshot.OFF_LOOP_AT, 100.0)
    snapshot = _bare_snapshot(view)
    threads: list[int] = []
    made = status_snapshot._Pass.of

    def spy(parts):
        threads.append(threading.get_ident())
        return made(parts)

    monkeypatch.setattr(status_snapshot._Pass, "of", spy)
    seen = {}

    async def main():
        await snapshot.refresh()
        first = snapshot._pass(view)
        seen["first"] = first
        await snapshot.refresh()  # unchanged: nothing made
        view.apply_hosts([HostState("clu/op-1/1", "sim", "m1", HostStatus.BUSY, 0.0)])
        view.version += 1  # as the session bumps it
        seen["lagging"] = snapshot._pass(view)  # within PASS_LAG: the pass made off the loop stands
        await trio.sleep(status_snapshot.PASS_LAG + 0.5)
        await snapshot.refresh()  # changed, and past the lag: made again, off the loop
        seen["second"] = snapshot._pass(view)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert snapshot.passes == snapshot.passes_off_loop == 2
    assert len(threads) == 2 and threading.get_ident() not in threads
    assert seen["lagging"] is seen["first"] and seen["second"] is not seen["first"]
    fleet = status_snapshot._Fleet(view, 200.0, snapshot.pieces, seen["second"])  # type: ignore[arg-type]
    inline = status_snapshot._Fleet(view, 200.0, snapshot.pieces)  # type: ignore[arg-type]
    assert fleet.machines == inline.machines and fleet.machines["sim"]["busy"] == 1
    assert fleet.overdue == inline.overdue and fleet.supplied == inline.supplied


def test_a_small_views_status_pass_stays_inline_and_exact():
    view = _priced_view(6, 100.0)
    snapshot = _bare_snapshot(view)

    async def main():
        await snapshot.refresh()  # small: nothing made here, nor in a thread
        assert snapshot.passes == 0
        first = snapshot._pass(view)
        view.version += 1
        assert snapshot._pass(view) is not first  # every change, at once

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert snapshot.passes == 2 and snapshot.passes_off_loop == 0
