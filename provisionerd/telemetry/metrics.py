"""The daemon's Prometheus metrics: one private registry, counters fed from two places, gauges read at scrape time.

``DaemonMetrics(snapshot)`` owns a private ``CollectorRegistry`` (never the global one: two daemons in one process,
or two tests, do not share a series). What it holds comes from three sources, so nothing else in the daemon
increments a metric:

- **the events stream** (``telemetry.events.EventLog``): the log owns an :class:`EventCounters` and adds every
  record it writes to it, which turns the events that count something into counters (link reconnects, lease
  events, intents committed or refused by reason, orphan findings and actions, resyncs and their duration);
- **the provider call path**: the daemon's call log (``provisionerd.daemon.metered.CallLog``) owns a
  :class:`CallCounters` and reports each call's end to it, for the call counter and its latency histogram;
- **the daemon's state snapshot**: ``snapshot()`` returns the status document (``provisionerd status --json``) and
  :class:`provisionerd.telemetry.metrics_snapshot.SnapshotCollector` turns it into gauges at each scrape (leases,
  link, machines by state, demand, back-offs, unhealthy providers).

Cardinality is bounded: no label carries a machine id, an op_id or free text; every label value is checked
(``_label``: a short printable name) and each counter admits at most ``MAX_SERIES`` label sets, after which new
ones are counted under ``other`` values. ``render()`` is what ``GET /metrics`` answers.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from provisionerd import __version__
from provisionerd.telemetry.metrics_snapshot import SnapshotCollector

#: At most this many label sets per counter; past it, new label sets count under ``other``.
MAX_SERIES = 2000
#: A label value: a configured name, a contract code or action (the config's name pattern, a little wider).
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")

#: The gate outcomes (``execution.gate.GateDecision.outcome``): ``admitted`` is a committed intent; the others
#: refusals (``finished`` marks the end of a mutation, not an intent, and is not counted).
GATE_REFUSALS = frozenset({"halted", "no_lease", "rejected", "link_down", "lapsed_before_ack", "lapsed_after_ack"})
#: Lease events counted, by the ``event`` label they get.
LEASE_EVENTS = {
    "lease_acquired": "acquired",
    "lease_renewed": "renewed",
    "lease_lost": "lost",
    "lease_denied": "denied",
    "lease_released": "released",
}
#: Latency buckets for provider calls: a one-shot call takes milliseconds; a cloud call seconds; timeouts a minute.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RESYNC_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _label(value: Any) -> str:
    """A label value that cannot grow the series without bound: a short name, or ``other``."""
    return value if isinstance(value, str) and _LABEL.match(value) else "other"


class _Bounded:
    """A labelled counter (or histogram) that admits at most ``MAX_SERIES`` label sets."""

    def __init__(self, metric: Counter | Histogram) -> None:
        self.metric = metric
        self._seen: set[tuple[str, ...]] = set()

    def labels(self, *values: Any) -> Any:
        key = tuple(_label(v) for v in values)
        if key not in self._seen:
            if len(self._seen) >= MAX_SERIES:
                key = tuple("other" for _ in key)
            self._seen.add(key)
        return self.metric.labels(*key)


class EventCounters:
    """The counters the events stream feeds: made by the ``EventLog`` that owns them (``EventLog.counters``), which
    calls ``add`` with every record it writes, and registered in the daemon's registry by ``DaemonMetrics``. No
    callback is handed around and nothing is dropped: a record is counted in the same call that writes it."""

    def __init__(self) -> None:
        self.reconnects = Counter(
            "provisionerd_link_reconnects", "Joins to a controller after the first one (every rejoin).", registry=None
        )
        self.link_breaks = Counter("provisionerd_link_breaks", "Controller links that went down.", registry=None)
        self.lease_events = _Bounded(
            Counter(
                "provisionerd_lease_events",
                "Lease events: acquired, renewed, lost, denied, released.",
                ["provider", "event"],
                registry=None,
            )
        )
        self.intents_committed = _Bounded(
            Counter(
                "provisionerd_intents_committed",
                "Intent facts the controller acknowledged and the gate admitted, by fact kind.",
                ["provider", "kind"],
                registry=None,
            )
        )
        self.intents_refused = _Bounded(
            Counter(
                "provisionerd_intents_refused",
                "Mutations the gate refused, by reason (halted, no_lease, rejected, link_down, lapsed_*).",
                ["provider", "kind", "reason"],
                registry=None,
            )
        )
        self.orphan_findings = _Bounded(
            Counter(
                "provisionerd_orphan_findings",
                "Orphan findings (new, or with a changed action), by class and planned action.",
                ["provider", "orphan_class", "action"],
                registry=None,
            )
        )
        self.orphan_actions = _Bounded(
            Counter(
                "provisionerd_orphan_actions",
                "Orphan actions carried out, by class, action and outcome.",
                ["provider", "orphan_class", "action", "outcome"],
                registry=None,
            )
        )
        self.resyncs = _Bounded(
            Counter(
                "provisionerd_resyncs",
                "Resyncs of the controller view: join (after every (re)join) or refresh (a later one on the link).",
                ["kind"],
                registry=None,
            )
        )
        self.resync_seconds = Histogram(
            "provisionerd_resync_duration_seconds",
            "From a join to its resync folded (trio's clock).",
            buckets=RESYNC_BUCKETS,
            registry=None,
        )
        self.unmet_rules = _Bounded(
            Counter(
                "provisionerd_unmet_demand_rules",
                "Unmet-demand plan notes (emitted when an item's reasons change), by each rule the note names.",
                ["rule"],
                registry=None,
            )
        )
        self._joins = 0
        self._join_at: dict[int, float] = {}  # generation -> trio time of its join (until its resync)

    def collectors(self) -> list[Counter | Histogram]:
        """What ``DaemonMetrics`` registers (each once)."""
        bounded = (self.lease_events, self.intents_committed, self.intents_refused, self.orphan_findings)
        more = (self.orphan_actions, self.resyncs, self.unmet_rules)
        return [self.reconnects, self.link_breaks, self.resync_seconds, *(b.metric for b in (*bounded, *more))]

    def add(self, record: Mapping[str, Any]) -> None:
        """Count what ``record`` (one emitted event) says. Reads fields with ``get`` and bounds every label
        (``_label``), so a record of any shape counts or is ignored; nothing here raises."""
        event = record.get("event")
        provider = record.get("provider")
        if event == "link_up":
            self._joins += 1
            if self._joins > 1:
                self.reconnects.inc()
        elif event == "link_down":
            self.link_breaks.inc()
        elif event == "join":
            generation, mono = record.get("generation"), record.get("mono")
            if isinstance(generation, int) and isinstance(mono, (int, float)):
                if len(self._join_at) > 16:  # joins whose resync never came: keep the memory bounded
                    self._join_at.clear()
                self._join_at[generation] = mono
        elif event == "resync":
            self.resyncs.labels("join").inc()
            generation, now = record.get("generation"), record.get("mono")
            started = self._join_at.pop(generation, None) if isinstance(generation, int) else None
            if started is not None and isinstance(now, (int, float)):
                self.resync_seconds.observe(max(now - started, 0.0))
        elif event == "refresh":
            self.resyncs.labels("refresh").inc()
        elif event in LEASE_EVENTS:
            self.lease_events.labels(provider, LEASE_EVENTS[event]).inc()
        elif event == "gate":
            outcome, kind = record.get("outcome"), record.get("fact")
            if outcome == "admitted":
                self.intents_committed.labels(provider, kind).inc()
            elif outcome in GATE_REFUSALS:
                self.intents_refused.labels(provider, kind, outcome).inc()
        elif event == "plan_note" and record.get("kind") == "unmet_demand":
            rules = record.get("rules")
            for rule in rules if isinstance(rules, list) else ():  # planner.unmet_rules: classified where made
                self.unmet_rules.labels(str(rule)).inc()
        elif event == "orphan_detected":
            self.orphan_findings.labels(provider, record.get("orphan_class"), record.get("action")).inc()
        elif event == "orphan_action":
            self.orphan_actions.labels(
                provider, record.get("orphan_class"), record.get("action"), record.get("outcome")
            ).inc()


class CallCounters:
    """The provider calls' counter and latency histogram: made by the ``CallLog`` that owns them
    (``daemon.metered``), which calls ``ended`` once per call, and registered by ``DaemonMetrics``."""

    def __init__(self) -> None:
        self.calls = _Bounded(
            Counter(
                "provisionerd_provider_calls",
                "Provider plugin calls, by action and outcome (ok, or the refusal code / unknown-outcome kind).",
                ["provider", "action", "outcome"],
                registry=None,
            )
        )
        self.call_seconds = _Bounded(
            Histogram(
                "provisionerd_provider_call_duration_seconds",
                "How long provider plugin calls took (trio's clock), by action.",
                ["provider", "action"],
                buckets=CALL_BUCKETS,
                registry=None,
            )
        )

    def collectors(self) -> list[Counter | Histogram]:
        return [self.calls.metric, self.call_seconds.metric]

    def ended(self, provider: str, action: str, outcome: str, seconds: float) -> None:
        """One provider call ended."""
        self.calls.labels(provider, action, outcome).inc()
        self.call_seconds.labels(provider, action).observe(max(seconds, 0.0))


class DaemonMetrics:
    """The daemon's registry (see the module docstring). ``snapshot``: the status document, read at each scrape;
    ``events`` / ``calls``: the counters the events log and the call log own (fresh ones when not given)."""

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, Any]],
        *,
        events: EventCounters | None = None,
        calls: CallCounters | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = events if events is not None else EventCounters()
        self.calls = calls if calls is not None else CallCounters()
        for collector in (*self.events.collectors(), *self.calls.collectors()):
            r.register(collector)
        self.http_refusals = _Bounded(
            Counter(
                "provisionerd_http_refusals",
                "Requests the metrics/health listener refused (too_large, timeout, bad_request, method, busy).",
                ["reason"],
                registry=r,
            )
        )
        self.snapshot = SnapshotCollector(snapshot)
        r.register(self.snapshot)
        # What a "daemon restarted" or "which version runs where" rule needs: process_start_time_seconds, CPU, memory,
        # open files (ProcessCollector: this process's /proc), python_info, and our build.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        build = Gauge(
            "provisionerd_build_info",
            "Always 1: the daemon's version and the Python that runs it, as labels.",
            ["version", "python"],
            registry=r,
        )
        build.labels(__version__, platform.python_version()).set(1)

    def http_refused(self, reason: str) -> None:
        """The metrics listener refused a request (``metrics_http.RefusalCounter``)."""
        self.http_refusals.labels(reason).inc()

    # --- the exposition -----------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition format (``GET /metrics``)."""
        return generate_latest(self.registry)
