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

**An HA pair sums right.** Both daemons of a pair read the same controller view, so each could export the whole
fleet. The fleet gauges of a provider (``FLEET_GAUGES``: machines by state, draining and unhealthy machines, demand
wanted and supplied) are exported only by the daemon whose lease on that provider is ``held``; the other one
exports none of them for it (its ``provisionerd_lease_state`` says why), so ``sum by (provider, state)
(provisionerd_machines)`` over the pair counts every machine once. ``provisionerd_demand_unplaced_machines`` is
cluster-wide: every daemon computes it alike (aggregate it with ``max``, not ``sum``).

**Series read 0 instead of vanishing.** Machines by state and lease and link states are exported for every state;
a (provider, template) whose demand series was exported once is exported at 0 when the demand no longer names it
(bounded: ``MAX_REMEMBERED`` pairs).

**Spend is a counter.** ``provisionerd_estimated_spend_total{provider, currency}`` integrates, between scrapes, what
the live priced machines cost per hour (the cost lines' ``rate``; trapezoids on ``clock``, trio's clock), and only
while this daemon holds the provider's lease: it never goes down and survives the fleet going empty, so
``increase(...[30d])`` summed over an HA pair is the month's estimated spend. Machines launched and returned
between two scrapes are not counted: an estimate, as the cost report is (docs/fleet.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LINK_STATES = ("down", "connecting", "syncing", "up", "halted")
LEASE_STATES = ("none", "held", "lapsed", "released")
MACHINE_STATES = ("requested", "booting", "joined", "idle", "busy", "lost", "returning")
BACKOFF_KINDS = ("throttle", "capacity", "unhealthy")
#: The gauges only a provider's lease holder exports (module docstring).
FLEET_GAUGES = (
    "provisionerd_machines",
    "provisionerd_machines_draining",
    "provisionerd_unhealthy_machines",
    "provisionerd_demand_wanted_machines",
    "provisionerd_demand_supplied_machines",
)
#: At most this many (provider, template) demand pairs, and (provider, currency) spend pairs, are remembered.
MAX_REMEMBERED = 2000
HOUR = 3600.0


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


def held(entry: Mapping[str, Any]) -> bool:
    """Whether the status of one provider says this daemon holds its lease (``lease.state == "held"``)."""
    return _map(entry.get("lease")).get("state") == "held"


class SpendCounter:
    """``provisionerd_estimated_spend_total``'s values (module docstring): per (provider, currency), the integral
    of the hourly rate over the time this daemon held the provider's lease."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], float] = {}
        self._last: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (time, rate) at the last scrape

    def update(self, lines: Any, holding: Callable[[str], bool], now: float) -> None:
        rates: dict[tuple[str, str], float] = {}
        for line in lines if isinstance(lines, list) else ():
            entry = _map(line)
            rate = _num(entry.get("rate"))
            provider, currency = entry.get("provider"), entry.get("currency")
            if isinstance(provider, str) and isinstance(currency, str) and rate is not None and rate >= 0:
                rates[(provider, currency)] = rate
        for key in set(self._last) | set(rates):
            rate = rates.get(key, 0.0)  # no line (the fleet went empty): nothing is being spent
            last = self._last.get(key)
            if key not in self.totals:
                if len(self.totals) >= MAX_REMEMBERED:
                    continue
                self.totals[key] = 0.0
            if last is not None and holding(key[0]) and now > last[0]:
                self.totals[key] += (last[1] + rate) / 2 * (now - last[0]) / HOUR
            self._last[key] = (now, rate)


def trio_clock() -> float:
    """trio's clock inside ``trio.run`` (the daemon's scrapes); the monotonic clock for a sync caller (a test)."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


class SnapshotCollector(Collector):
    """See the module docstring. ``clock``: the time the spend counter integrates over (trio's clock)."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], *, clock: Callable[[], float] = trio_clock) -> None:
        self._snapshot = snapshot
        self._clock = clock
        self._templates: set[tuple[str, str]] = set()  # (provider, template) pairs whose demand was exported
        self.spend = SpendCounter()

    def describe(self) -> list[Metric]:
        # Nothing at registration: the snapshot needs a running daemon (trio's clock), and these names are ours.
        return []

    def collect(self) -> Iterator[Metric]:
        doc = _map(self._snapshot())
        providers = _map(doc.get("providers"))
        yield from _link(doc)
        yield from _providers(providers, self._templates)
        demand = _map(doc.get("demand"))
        unplaced = GaugeMetricFamily(
            "provisionerd_demand_unplaced_machines",
            "Machines the demand wants that no provider's machines or intents serve yet (cluster-wide: use max).",
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
        self.spend.update(doc.get("cost"), lambda name: held(_map(providers.get(name))), self._clock())
        spend = CounterMetricFamily(
            "provisionerd_estimated_spend",
            "Estimated spend while this daemon held the provider's lease: the hourly price of the live machines,"
            " integrated (docs/metrics.md).",
            labels=["provider", "currency"],
        )
        for (provider, currency), total in sorted(self.spend.totals.items()):
            spend.add_metric([provider, currency], total)
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


def _providers(providers: Mapping[str, Any], templates: set[tuple[str, str]]) -> Iterator[Metric]:
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
        holder = held(p)
        fleet_health = _map(_map(p.get("health")).get("machines"))
        if holder:  # the fleet gauges: the lease holder's alone (module docstring)
            counts = _map(p.get("machines"))
            draining.add_metric([name], _num(p.get("draining")) or 0.0)
            sick_machines.add_metric([name], _num(fleet_health.get("unhealthy")) or 0.0)
            for state in MACHINE_STATES:
                machines.add_metric([name, state], _num(counts.get(state)) or 0.0)
            by_template = _map(_map(p.get("demand")).get("by_template"))
            for template in by_template:
                if isinstance(template, str) and len(templates) < MAX_REMEMBERED:
                    templates.add((name, template))
            for provider, template in sorted(templates):
                if provider != name:
                    continue
                numbers = _map(by_template.get(template))  # not named any more: 0, not a vanished series
                wanted.add_metric([name, template], _num(numbers.get("wanted")) or 0.0)
                supplied.add_metric([name, template], _num(numbers.get("supplied")) or 0.0)
        active = _map(p.get("backoffs"))
        for kind in BACKOFF_KINDS:
            backoffs.add_metric([name, kind], _num(active.get(kind)) or 0.0)
        health = _map(p.get("health"))
        sick = health.get("state") == "unhealthy"
        code = health.get("code")
        unhealthy.add_metric([name, code if sick and isinstance(code, str) else "none"], 1.0 if sick else 0.0)
        protected.add_metric([name], 1.0 if fleet_health.get("protected") is True else 0.0)
        if (value := _num(p.get("offers"))) is not None:
            offers.add_metric([name], value)
        if (value := _num(_map(p.get("last_call")).get("age_s"))) is not None:
            last_call.add_metric([name], value)
        if (value := _num(_map(p.get("step")).get("step"))) is not None:
            step.add_metric([name], value)
    yield from (lease_state, standby, term, seq, valid, machines, wanted, supplied, backoffs, unhealthy, offers)
    yield from (last_call, step, protected, sick_machines, draining)
