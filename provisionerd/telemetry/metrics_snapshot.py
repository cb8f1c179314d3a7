"""Gauges read from the daemon's state snapshot at scrape time: a custom Prometheus collector, no wiring.

``SnapshotCollector(snapshot)`` calls ``snapshot()`` once per scrape: the status document ``provisionerd status
--json`` prints (``provisionerd.daemon.status_snapshot`` builds it). Everything it reports is a gauge of what the
daemon holds now, so it cannot drift from ``status``: the two read the same document. The document's keys read here:

- ``link.state``, ``link.generation``; ``controller.halted``; ``reconcile.cycles``;
- ``providers.<name>``: ``lease`` (``state``, ``epoch`` as ``"term.seq"``, ``remaining``, ``standby``),
  ``machines`` (state -> count), ``demand.by_template`` (template -> ``wanted``/``supplied``), ``backoffs``
  (kind -> count), ``health`` (``state``, ``code``, ``machines.protected``, ``machines.unhealthy``), ``offers``,
  ``last_call.age_s``;
- ``demand.unplaced``; ``health.loop_heartbeat_age_s``; ``ready.ok``.

A key missing or of the wrong type is skipped, never an error: a scrape always answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LINK_STATES = ("down", "connecting", "syncing", "up", "halted")
LEASE_STATES = ("none", "held", "lapsed", "released")
MACHINE_STATES = ("requested", "booting", "joined", "idle", "busy", "lost", "returning")
BACKOFF_KINDS = ("throttle", "capacity", "unhealthy")


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _epoch(text: Any) -> tuple[int, int] | None:
    if not isinstance(text, str):
        return None
    term, sep, seq = text.partition(".")
    return (int(term), int(seq)) if sep and term.isdigit() and seq.isdigit() else None


class SnapshotCollector(Collector):
    """See the module docstring."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        # Nothing at registration: the snapshot needs a running daemon (trio's clock), and these names are ours.
        return []

    def collect(self) -> Iterator[Metric]:
        doc = _map(self._snapshot())
        yield from _link(doc)
        yield from _providers(_map(doc.get("providers")))
        demand = _map(doc.get("demand"))
        unplaced = GaugeMetricFamily(
            "provisionerd_demand_unplaced_machines",
            "Machines the demand wants that no provider's machines or intents serve yet.",
        )
        if (value := _num(demand.get("unplaced"))) is not None:
            unplaced.add_metric([], value)
        yield unplaced
        beat = GaugeMetricFamily(
            "provisionerd_loop_heartbeat_age_seconds", "Seconds since the reconcile loop last turned (trio's clock)."
        )
        if (value := _num(_map(doc.get("health")).get("loop_heartbeat_age_s"))) is not None:
            beat.add_metric([], value)
        yield beat
        ready = GaugeMetricFamily("provisionerd_ready", "1 when /readyz answers ready (joined, resynced, leases).")
        if (value := _num(_map(doc.get("ready")).get("ok"))) is not None:
            ready.add_metric([], value)
        yield ready
        spend = _gauge(
            "provisionerd_estimated_spend",
            "Estimated spend so far of the machines the daemon's view holds: quote x hours (docs/fleet.md).",
            "provider",
            "currency",
        )
        lines = doc.get("cost")
        for line in lines if isinstance(lines, list) else ():
            entry = _map(line)
            if (value := _num(entry.get("amount"))) is not None:
                spend.add_metric([str(entry.get("provider")), str(entry.get("currency"))], value)
        yield spend
        refused = CounterMetricFamily(
            "provisionerd_drains_refused",
            "DrainRequested facts kept to the daemon: the controller did not announce JoinReply.drains.",
        )
        if (value := _num(doc.get("drains_refused"))) is not None:
            refused.add_metric([], value)
        yield refused


def _link(doc: Mapping[str, Any]) -> Iterator[Metric]:
    link = _map(doc.get("link"))
    state = _gauge("provisionerd_link_state", "The controller link's state (1 for the current one).", "state")
    for name in LINK_STATES:
        state.add_metric([name], 1.0 if link.get("state") == name else 0.0)
    yield state
    generation = GaugeMetricFamily("provisionerd_link_generation", "Joins of this process so far (the link's number).")
    if (value := _num(link.get("generation"))) is not None:
        generation.add_metric([], value)
    yield generation
    halted = GaugeMetricFamily(
        "provisionerd_controller_halted", "1 while every mutation is stopped after controller amnesia."
    )
    if (value := _num(_map(doc.get("controller")).get("halted"))) is not None:
        halted.add_metric([], value)
    yield halted
    cycles = CounterMetricFamily("provisionerd_reconcile_cycles", "Plan passes of the reconcile loop.")
    if (value := _num(_map(doc.get("reconcile")).get("cycles"))) is not None:
        cycles.add_metric([], value)
    yield cycles


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


def _providers(providers: Mapping[str, Any]) -> Iterator[Metric]:
    p_ = "provider"
    lease_state = _gauge("provisionerd_lease_state", "The lease state (1 for the current one).", p_, "state")
    standby = _gauge(
        "provisionerd_lease_standby", "1 while another holder has the lease and this daemon waits (standby).", p_
    )
    term = _gauge("provisionerd_lease_epoch_term", "The lease epoch's HA term.", p_)
    seq = _gauge("provisionerd_lease_epoch_seq", "The lease epoch's sequence number.", p_)
    valid = _gauge("provisionerd_lease_valid_seconds", "Seconds the held lease stays valid (local clock).", p_)
    machines = _gauge("provisionerd_machines", "Machines by state (requested: of intents, not created).", p_, "state")
    wanted = _gauge(
        "provisionerd_demand_wanted_machines",
        "Machines the demand wants, by provider and template serving it.",
        p_,
        "template",
    )
    supplied = _gauge(
        "provisionerd_demand_supplied_machines",
        "Machines joined (joined, idle or busy), by provider and template.",
        p_,
        "template",
    )
    backoffs = _gauge(
        "provisionerd_backoffs_active", "Back-offs in force: throttle, capacity (per offer), unhealthy.", p_, "kind"
    )
    unhealthy = _gauge(
        "provisionerd_provider_unhealthy",
        "1 while the provider is unhealthy (code: auth_failed, invalid_request, quota_exceeded, protocol_violation;"
        " none when healthy).",
        p_,
        "code",
    )
    protected = _gauge(
        "provisionerd_provider_protected",
        "1 while more machines were unhealthy than max_unhealthy allows: no replacement is requested.",
        p_,
    )
    sick_machines = _gauge(
        "provisionerd_unhealthy_machines",
        "Machines found unhealthy (lost, never joined, timed out, short of their template) in max_unhealthy_window.",
        p_,
    )
    draining = _gauge(
        "provisionerd_machines_draining",
        "Active machines asked to drain (busy past max_ttl): returned when idle or at drain_timeout.",
        p_,
    )
    offers = _gauge("provisionerd_offers", "Offers (templates) last read from the provider.", p_)
    step = _gauge("provisionerd_provider_step", "The adaptive step: most new machines per step interval now.", p_)
    last_call = _gauge("provisionerd_provider_last_call_age_seconds", "Seconds since the last provider call ended.", p_)
    for name, entry in providers.items():
        p = _map(entry)
        lease = _map(p.get("lease"))
        for state in LEASE_STATES:
            lease_state.add_metric([name, state], 1.0 if lease.get("state") == state else 0.0)
        standby.add_metric([name], 1.0 if lease.get("standby") is True else 0.0)
        if (epoch := _epoch(lease.get("epoch"))) is not None:
            term.add_metric([name], float(epoch[0]))
            seq.add_metric([name], float(epoch[1]))
        valid.add_metric([name], _num(lease.get("remaining")) or 0.0)
        counts = _map(p.get("machines"))
        draining.add_metric([name], _num(p.get("draining")) or 0.0)
        for state in MACHINE_STATES:
            machines.add_metric([name, state], _num(counts.get(state)) or 0.0)
        for template, numbers in _map(_map(p.get("demand")).get("by_template")).items():
            wanted.add_metric([name, template], _num(_map(numbers).get("wanted")) or 0.0)
            supplied.add_metric([name, template], _num(_map(numbers).get("supplied")) or 0.0)
        active = _map(p.get("backoffs"))
        for kind in BACKOFF_KINDS:
            backoffs.add_metric([name, kind], _num(active.get(kind)) or 0.0)
        health = _map(p.get("health"))
        sick = health.get("state") == "unhealthy"
        code = health.get("code")
        unhealthy.add_metric([name, code if sick and isinstance(code, str) else "none"], 1.0 if sick else 0.0)
        fleet_health = _map(health.get("machines"))
        protected.add_metric([name], 1.0 if fleet_health.get("protected") is True else 0.0)
        sick_machines.add_metric([name], _num(fleet_health.get("unhealthy")) or 0.0)
        if (value := _num(p.get("offers"))) is not None:
            offers.add_metric([name], value)
        if (value := _num(_map(p.get("last_call")).get("age_s"))) is not None:
            last_call.add_metric([name], value)
        if (value := _num(_map(p.get("step")).get("step"))) is not None:
            step.add_metric([name], value)
    yield from (lease_state, standby, term, seq, valid, machines, wanted, supplied, backoffs, unhealthy, offers)
    yield from (last_call, step, protected, sick_machines, draining)
