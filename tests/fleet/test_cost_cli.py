"""``provisionerd cost --json`` against the daemon's admin command ``cost``: the real ``DaemonCore`` command over a
real unix socket (the CLI in a thread), its view folded from facts; the total is what the facts say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from rigs.daemon import parsed_config, short_dir

from provisionerd.cli import main as cli
from provisionerd.controller.view import ControllerView
from provisionerd.daemon.admin_socket import serve_admin_socket
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import (
    CommittedFact,
    Epoch,
    InstanceFact,
    Lost,
    PriceQuote,
    RequestIntent,
    Returned,
)
from provisionerd.planner.fact_view import FactView
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider

PROVIDERS = """
    [[providers]]
    name = "sim"
    transport = "oneshot"
    path = "plugins/sim"
"""
T0 = 1_800_000_000.0
NOW = T0 + 7200.0
USD = PriceQuote(0.5, "USD", "hour", "sim", "2026-01-01T00:00:00Z")
EUR = PriceQuote(2.0, "EUR", "hour", "sim", "2026-01-01T00:00:00Z")
E = Epoch(1, 1)


async def unreachable(address: str) -> trio.abc.Stream:
    raise OSError(f"nothing runs in this test: {address}")


def facts() -> list[CommittedFact]:
    made = [
        RequestIntent("sim", E, "op-1", "small", 3, ("r0", "r1", "r2"), ("h0", "h1", "h2"), "d", price=USD),
        InstanceFact("sim", E, "op-1", "r0", "m0", "small", "h0", launch_time=T0, price=USD),  # live: 2 h
        InstanceFact("sim", E, "op-1", "r1", "m1", "small", "h1", launch_time=T0, price=USD),  # returned after 1 h
        InstanceFact("sim", E, "op-1", "r2", "m2", "small", "h2", launch_time=T0, price=USD),  # lost: no end
        RequestIntent("sim", E, "op-2", "big", 1, ("r3",), ("h3",), "d", price=EUR),
        InstanceFact("sim", E, "op-2", "r3", "m3", "big", "h3", launch_time=T0 + 3600, price=EUR),  # live: 1 h
        RequestIntent("sim", E, "op-3", "free", 1, ("r4",), ("h4",), "d"),
        InstanceFact("sim", E, "op-3", "r4", "m4", "free", "h4", launch_time=T0),  # unpriced
        Returned("sim", E, "op-4", ("m1",), at=T0 + 3600),
        Lost("sim", E, "op-5", "m2", "reclaimed"),
    ]
    return [CommittedFact(i + 1, f) for i, f in enumerate(made)]


def test_the_cost_command_reports_the_spend_the_facts_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = parsed_config(tmp_path, PROVIDERS)
    core = DaemonCore(
        config, connect=unreachable, events=EventLog(), providers={"sim": PluginClient(FakeProvider("sim"))}
    )
    core.wall = lambda: NOW
    codes: list[int] = []

    async def main(sock: Path) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, sock, dict, {"cost": core.cost})
            codes.append(await trio.to_thread.run_sync(cli.main, ["cost", "--socket", str(sock), "--json", "--live"]))
            view = ControllerView(1, "ctl0:7400", 1, FactView(), {})
            for committed in facts():
                view.facts.apply(committed)
            core.pieces.session.view = view
            codes.append(await trio.to_thread.run_sync(cli.main, ["cost", "--socket", str(sock), "--json", "--live"]))
            codes.append(await trio.to_thread.run_sync(cli.main, ["cost", "--socket", str(sock), "--live"]))
            # The whole history needs the controller's log: no link here, so no answer.
            codes.append(await trio.to_thread.run_sync(cli.main, ["cost", "--socket", str(sock), "--json"]))
            nursery.cancel_scope.cancel()

    with short_dir("pd-cost-") as state:
        trio.run(main, state / "admin.sock")
    out = capsys.readouterr()
    assert codes == [1, 0, 0, 1] and "no view of the facts yet" in out.err
    assert "cannot read the controller's history: controller link is" in out.err
    report, _ = json.JSONDecoder().raw_decode(out.out)  # the --json answer, then the table
    # m0: 0.5 x 2 h, m1: 0.5 x 1 h (returned), m3: 2.0 EUR x 1 h; m2 lost (no end), m4 unpriced.
    assert report["totals"] == {"USD": pytest.approx(1.5), "EUR": pytest.approx(2.0)}
    assert report["not_estimated"] == {"unpriced": 1, "other_unit": 0, "no_time": 1}
    assert [(line["template_id"], line["machines"], line["machine_hours"]) for line in report["lines"]] == [
        ("big", 1, 1.0),
        ("small", 2, 3.0),
    ]
    assert "total USD: 1.5000" in out.out and "total EUR: 2.0000" in out.out


def test_the_spend_counter_integrates_the_hourly_rate_while_held_and_survives_an_empty_fleet() -> None:
    """issue 32 item 6: ``provisionerd_estimated_spend_total`` never goes down, keeps its value when the fleet goes
    empty (so ``increase()`` gives a month's spend), and counts only while this daemon holds the lease."""
    from provisionerd.daemon.status_snapshot import _Parts, _Pass
    from provisionerd.telemetry.metrics_snapshot import SnapshotCollector

    view = ControllerView(1, "ctl0:7400", 1, FactView(), {})
    for committed in facts():
        view.facts.apply(committed)
    lines = _Pass.of(_Parts.of(view)).spend.at(NOW)
    assert {(e["currency"], e["rate"]) for e in lines} == {("EUR", 2.0), ("USD", 0.5)}  # the live machines' rate
    clock = [0.0]
    doc: dict = {"providers": {"sim": {"lease": {"state": "held"}}}, "cost": lines}
    collector = SnapshotCollector(lambda: doc, clock=lambda: clock[0])

    def totals() -> dict[str, float]:
        (family,) = [f for f in collector.collect() if f.name == "provisionerd_estimated_spend"]
        assert family.type == "counter"
        return {s.labels["currency"]: round(s.value, 6) for s in family.samples if s.name.endswith("_total")}

    assert totals() == {"EUR": 0.0, "USD": 0.0}  # counted from the first scrape on
    clock[0] = 3600.0
    assert totals() == {"EUR": 2.0, "USD": 0.5}  # one hour of both rates
    doc["cost"] = []  # the fleet went empty (the view holds no machine any more)
    clock[0] = 7200.0
    assert totals() == {"EUR": 3.0, "USD": 0.75}  # the rate fell to 0 within that hour (trapezoid)
    clock[0] = 72000.0
    assert totals() == {"EUR": 3.0, "USD": 0.75}  # empty: the series stays, at its total
    doc = {"providers": {"sim": {"lease": {"state": "none"}}}, "cost": lines}
    clock[0] = 75600.0
    assert totals() == {"EUR": 3.0, "USD": 0.75}  # another daemon holds the lease: it counts, not this one
    doc["providers"]["sim"]["lease"]["state"] = "held"
    clock[0] = 79200.0
    assert totals() == {"EUR": 5.0, "USD": 1.25}  # held again: only the hour since
