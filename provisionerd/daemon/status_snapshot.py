"""Per-provider status, readiness and liveness: the part of the status document the operator's questions need.

``StatusSnapshot(pieces, loop, feed, calls)`` reads what the running daemon holds (the controller view, the lease
keepers, the planner state, the offer feed, the last provider calls) and answers, on demand, without caching:

- ``document()``: the keys ``provisionerd status`` adds to the daemon's status document (``--json`` prints them as
  they are; ``provisionerd.telemetry.metrics_snapshot`` turns the same document into gauges at each scrape):

  - ``providers.<name>``: ``lease`` (state, epoch, remaining, ``standby``), ``machines`` by state (``requested``:
    machines of committed intents not yet created; ``booting``: created, not joined; ``joined``, ``idle``,
    ``busy``, ``lost``: the controller's host status, also for a machine whose instance fact is not in yet;
    ``returning``), ``demand`` (``wanted`` and ``supplied``,
    in total and ``by_template``), ``last_call`` (action, outcome, age), ``backoffs`` (kind -> count) and their
    ``backoff_details``, ``health`` (``reconcile.provider_health``'s entry), ``offers``, ``step`` (the adaptive
    step in force, its floor and cap and why it last changed: ``ReconcileLoop.steps``), and ``checks``: the
    four questions kept apart, each ``{"state": ok | failed | pending | limited | unknown, "detail": ...}``:
    **access** (were the credentials accepted?), **connectivity** (does the plugin answer?), **readiness** (do
    machines join?), **capacity** (are offers available, is a back-off in force?);
  - ``demand``: ``wanted`` (the snapshot's total) and ``unplaced`` (wanted machines no machine or intent serves);
  - ``health``: the loop heartbeat's age and whether it is stale; ``ready``: ``ok`` and the reasons it is not.

- ``live(now)``: ``/healthz``: the reconcile loop turned within ``stale_after`` seconds (trio's clock);
- ``ready(now)``: ``/readyz``: the link is up and resynced, and every provider's lease is held with the view
  resynced since its grant, or deliberately on standby (another holder has it: the controller answered ``held``).

Wanted vs supplied per provider and template: each demand item's count is attributed to the (provider, template)
of the machines (active) and open intents serving it, in that order, up to its count; the rest is ``unplaced``.
``supplied`` counts the active machines whose host is joined, idle or busy. One pass over the view's machines per
view: cost follows the live fleet, paid once per change of the view, not per status request or scrape
(``_Pass``, kept with the view object and its ``version``; measured: 0.07-0.2 s at 100,000 machines on a loaded
2-core machine, 1-2 us per machine, the first time; a query on an unchanged view reads the counters only). The
clock-dependent parts are read from what the pass kept: join deadlines from the sorted launch times of the machines
not joined, the spend from running sums over the live machines' launch times (``_SpendCurve``).
"""

from __future__ import annotations

import bisect
import math
import time
import weakref
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper, LeaseState
from provisionerd.controller.session_settings import LinkState
from provisionerd.controller.view import ControllerView
from provisionerd.daemon.builder import Pieces
from provisionerd.daemon.metered import NO_ANSWER, CallLog, outcome_of
from provisionerd.domain.model import HostStatus
from provisionerd.execution.loop import ReconcileLoop
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.execution.orphan_offload import OFF_LOOP_AT
from provisionerd.planner.cost import HOUR, estimate, machine_spend
from provisionerd.planner.fact_view import IntentRecord, MachineRecord, MachineState

JOINED = ("joined", "idle", "busy")
#: Seconds a large view's pass made by ``StatusSnapshot.refresh`` stands for the view while it changes.
PASS_LAG = 1.0
#: Passes one ``StatusSnapshot.refresh`` makes at most, each over the view current when it starts.
REFRESH_TRIES = 3
OfferKey = tuple[str, str]


def standby(keeper: LeaseKeeper) -> bool:
    """Whether the keeper waits because another holder has the lease (the controller refused it as ``held``)."""
    return keeper.state is not LeaseState.HELD and keeper.reason == "denied: held"


class StatusSnapshot:
    """See the module docstring."""

    def __init__(self, pieces: Pieces, loop: ReconcileLoop, feed: OfferFeed, calls: CallLog) -> None:
        self.pieces, self.loop, self.feed, self.calls = pieces, loop, feed, calls
        #: Seconds without a turn of the reconcile loop after which ``/healthz`` says unhealthy.
        self.stale_after = max(30.0, 3 * loop.settings.replan_interval)
        self.started_at: float | None = None  # trio's clock when the daemon's tasks started (``mark_started``)
        #: The last pass: its view, the view's version it read and trio's time it was made.
        self._cached: tuple[weakref.ref[ControllerView], int, float, _Pass] | None = None
        self.passes = 0  # passes over a view made so far, and how long the last one took (CPU-bound, seconds)
        self.pass_seconds = 0.0
        self.passes_off_loop = 0  # of them, made in a worker thread by ``refresh``

    def mark_started(self) -> None:
        self.started_at = trio.current_time()

    # --- liveness and readiness ---------------------------------------------------------------------------------

    def heartbeat_age(self, now: float) -> float | None:
        beat = self.loop.beat if self.loop.beat is not None else self.started_at
        return None if beat is None else max(now - beat, 0.0)

    def live(self, now: float) -> tuple[bool, str]:
        age = self.heartbeat_age(now)
        if age is None:
            return False, "not started"
        if age > self.stale_after:
            return False, f"the reconcile loop has not turned for {age:.1f}s (limit {self.stale_after:g}s)"
        return True, f"the reconcile loop turned {age:.1f}s ago"

    def ready(self, now: float) -> tuple[bool, list[str]]:
        session = self.pieces.session
        reasons: list[str] = []
        if session.state is not LinkState.UP or session.view is None:
            reasons.append(f"controller link {session.state.value}: not joined and resynced")
        for name, keeper in self.pieces.keepers.items():
            if keeper.valid(now):
                if not session.synced_for(name):
                    reasons.append(f"provider {name!r}: lease held, view not resynced since the grant")
            elif not standby(keeper):
                reasons.append(f"provider {name!r}: lease {keeper.status(now).state.value} ({keeper.reason})")
        return not reasons, reasons

    # --- the document -------------------------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        now, wall_now = trio.current_time(), self.pieces.wall()
        view = self.pieces.session.view
        fleet = _Fleet(view, wall_now, self.pieces, None if view is None else self._pass(view))
        health = self.loop.provider_health()
        steps, windows = self.loop.steps(), self.loop.settle_windows()
        providers = {
            name: {
                **self._provider(name, keeper, now, wall_now, fleet, health.get(name, {"state": "healthy"})),
                "step": steps.get(name),
                "rejoin": windows.get(name),
                "offers": self.feed.describe(name, now),
            }
            for name, keeper in self.pieces.keepers.items()
        }
        ok, reasons = self.ready(now)
        live, why = self.live(now)
        age = self.heartbeat_age(now)
        return {
            "providers": providers,
            "demand": {"wanted": fleet.wanted_total, "unplaced": fleet.unplaced},
            "health": {
                "live": live,
                "detail": why,
                "loop_heartbeat_age_s": None if age is None else round(age, 3),
            },
            "ready": {"ok": ok, "reasons": reasons},
            "cost": [] if view is None else self._pass(view).spend.at(wall_now),
            # DrainRequested facts kept to the daemon: the controller did not announce JoinReply.drains.
            "drains_refused": self.pieces.ops.drains_refused,
        }

    async def refresh(self) -> None:
        """Make the pass ``document()`` reads ready, off the loop when the view is large: what the admin socket's
        ``status`` and a metrics scrape await before they read the document.

        A view of ``OFF_LOOP_AT`` machines or more that changed since the last pass is passed over in a worker
        thread, on copies of its record lists taken at once (~1 ms per 100,000 on the loop); the records are
        shared, and folding updates them field by field. One such pass is 0.1-0.2 s of CPU at 100,000 machines:
        inline, one step of the loop. The document then reads that pass for up to ``PASS_LAG`` seconds while the
        view moves on (a busy fleet changes it every heartbeat), instead of making another one inline. A smaller
        view is passed over inline, as ``document()`` would (deterministic on trio's ``MockClock``).

        A view replaced while its pass was being made (each resync builds a new one, a lease grant brings one) is
        passed over again, up to ``REFRESH_TRIES`` passes in all: the document would otherwise make its own, inline.
        """
        for _ in range(REFRESH_TRIES):
            view = self.pieces.session.view
            if view is None or self._fresh(view) is not None or len(view.facts.machines) < OFF_LOOP_AT:
                return
            version, parts = view.version, _Parts.of(view)
            started = time.perf_counter()
            passed = await trio.to_thread.run_sync(_Pass.of, parts)
            self._keep(view, version, passed, started, made_at=trio.current_time())
            self.passes_off_loop += 1

    def _fresh(self, view: ControllerView) -> _Pass | None:
        """The last pass when it may stand for ``view``: made over this very view object, at its version, or (for
        a large view, made by ``refresh``) within ``PASS_LAG`` seconds."""
        cached = self._cached
        if cached is None or cached[0]() is not view:
            return None
        if cached[1] == view.version:
            return cached[3]
        if len(view.facts.machines) >= OFF_LOOP_AT and trio.current_time() - cached[2] <= PASS_LAG:
            return cached[3]
        return None

    def _keep(
        self, view: ControllerView, version: int, passed: _Pass, started: float, *, made_at: float = -math.inf
    ) -> None:
        """Keep ``passed`` as the pass over ``view`` at ``version``; ``made_at``: trio's time ``refresh`` made it
        (an inline pass stands only for its own version)."""
        # A weak reference: the view a resync replaced is not held alive by the status (its machines are the
        # daemon's memory at 100k).
        self._cached = (weakref.ref(view), version, made_at, passed)
        self.passes += 1
        self.pass_seconds = time.perf_counter() - started

    def _pass(self, view: ControllerView) -> _Pass:
        """The pass over ``view``, made again (inline) only when the view changed since the last one: a new view
        (every resync builds one) or a change to this one (``version``: a fact, a host push, a demand snapshot),
        but see ``refresh``."""
        fresh = self._fresh(view)
        if fresh is None:
            started = time.perf_counter()
            fresh = _Pass.of(_Parts.of(view))
            self._keep(view, view.version, fresh, started)
        return fresh

    def _provider(
        self, name: str, keeper: LeaseKeeper, now: float, wall_now: float, fleet: _Fleet, health: dict[str, Any]
    ) -> dict[str, Any]:
        status = keeper.status(now)
        capacity = self.loop.state.capacity
        details: list[dict[str, Any]] = []
        throttled = capacity.throttled(name, wall_now)
        if throttled is not None:
            details.append({"kind": "throttle", "ends_in_s": round(throttled - wall_now, 3)})
        for (provider, template), until in sorted(capacity.unavailable.items()):
            if provider == name and until > wall_now:
                details.append({"kind": "capacity", "template": template, "ends_in_s": round(until - wall_now, 3)})
        if name in capacity.unhealthy:
            entry = capacity.unhealthy[name]
            probe_in = round(entry.until - wall_now, 3)
            details.append({"kind": "unhealthy", "code": entry.code, "next_probe_in_s": probe_in})
        backoffs = Counter(d["kind"] for d in details)
        offers = sum(1 for p in self.feed.catalog.by_key.values() if p.offer.provider == name)
        last = self.calls.last.get(name)
        by_template = fleet.by_template(name)
        return {
            "lease": {
                "state": status.state.value,
                "epoch": str(status.epoch) if status.epoch else None,
                "remaining": None if status.remaining is None else round(status.remaining, 3),
                "standby": standby(keeper),
                "reason": status.reason,
            },
            "machines": {state: fleet.machines[name][state] for state in _STATES},
            # Of the active machines above: asked to drain (max_ttl passed while busy), returned when idle or at
            # drain_timeout (planner.drain).
            "draining": fleet.draining.get(name, 0),
            "demand": {
                "wanted": sum(t["wanted"] for t in by_template.values()),
                "supplied": sum(t["supplied"] for t in by_template.values()),
                "by_template": by_template,
            },
            "last_call": None
            if last is None
            else {
                "action": last.action,
                "outcome": last.outcome,
                "age_s": round(now - last.at, 3),
                "seconds": round(last.seconds, 3),
            },
            "backoffs": {kind: backoffs.get(kind, 0) for kind in ("throttle", "capacity", "unhealthy")},
            "backoff_details": details,
            "health": health,
            "offers": offers,
            "checks": {
                "access": self._access(name, health),
                "connectivity": self._connectivity(name, now),
                "readiness": fleet.readiness(name),
                "capacity": self._capacity(name, health, offers, details),
            },
        }

    def _access(self, name: str, health: dict[str, Any]) -> dict[str, str]:
        last = self.calls.last.get(name)
        if health.get("code") == "auth_failed":
            return {"state": "failed", "detail": f"auth_failed: {health.get('detail', '')}"}
        if last is not None and last.outcome == "auth_failed":
            return {"state": "failed", "detail": f"auth_failed: {last.detail}"}
        ok = self.calls.last_ok.get(name)
        if ok is None:
            return {"state": "unknown", "detail": "no call has succeeded yet"}
        return {"state": "ok", "detail": f"{ok.action} accepted"}

    def _connectivity(self, name: str, now: float) -> dict[str, str]:
        last = self.calls.last.get(name)
        if last is None:
            return {"state": "unknown", "detail": "no call yet"}
        if last.outcome in NO_ANSWER:
            age = now - last.at
            return {"state": "failed", "detail": f"{last.action}: {last.outcome} {age:.1f}s ago: {last.detail}"}
        return {"state": "ok", "detail": f"{last.action} answered {last.outcome} {now - last.at:.1f}s ago"}

    def _capacity(
        self, name: str, health: dict[str, Any], offers: int, details: list[dict[str, Any]]
    ) -> dict[str, str]:
        if health.get("code") == "quota_exceeded":
            return {"state": "failed", "detail": f"quota_exceeded: {health.get('detail', '')}"}
        error = self.feed.errors.get(name)
        if name not in self.feed.latest:
            why = "not read yet" if error is None else f"not read: the last read failed ({outcome_of(error)})"
            return {"state": "unknown", "detail": f"offers {why}"}
        if error is not None:
            kept = self.feed.describe(name)
            stale = "stale: no new machine from them" if kept.get("stale") else "still used"
            again = "at its next probe" if health.get("state") == "unhealthy" else f"in {kept.get('retry_in_s')}s"
            return {
                "state": "limited",
                "detail": f"the last read failed ({outcome_of(error)}): the offers read {kept.get('age_s')}s ago are"
                f" kept ({stale}); read again {again}",
            }
        if offers == 0:
            return {"state": "failed", "detail": "the provider offers no template"}
        if details:
            kinds = ", ".join(sorted({d["kind"] for d in details}))
            return {"state": "limited", "detail": f"{offers} offer(s); back-off in force: {kinds}"}
        return {"state": "ok", "detail": f"{offers} offer(s), no back-off"}


_STATES = ("requested", "booting", "joined", "idle", "busy", "lost", "returning")
_HOST_STATE = {status: status.value for status in HostStatus}


@attrs.frozen
class _Parts:
    """What a pass reads of a view, copied at once on the loop so a worker thread can read it while the session
    folds new facts into the view: its machine records, its host table (read by single lookups) and the intent
    records of its open ops."""

    machines: list[MachineRecord]
    hosts: Mapping[str, Any]
    open_intents: list[IntentRecord]

    @classmethod
    def of(cls, view: ControllerView) -> _Parts:
        facts = view.facts
        opened = [facts.intents.get(op_id) for op_id in facts.open_ops]
        return cls(list(facts.machines.values()), view.hosts, [r for r in opened if r is not None])


class _Pass:
    """The one pass over a view that ``document()`` needs, independent of the clock: machines by (provider,
    template, demand, state), the launch times of machines not joined yet, and the spend curve. Built again only
    when the view changes (``StatusSnapshot`` keeps the last one with the view object and its ``version``)."""

    @classmethod
    def of(cls, parts: _Parts) -> _Pass:
        return cls(parts.machines, parts.hosts, parts.open_intents)

    def __init__(
        self, machines: Sequence[MachineRecord], hosts: Mapping[str, Any], open_intents: Iterable[IntentRecord]
    ) -> None:
        # The hot loop does one dict update per machine, keyed by (provider, template, demand_id, state); the few
        # distinct keys are summed up after it (a Counter per machine cost ~10 us each: 1 s at 100,000 machines).
        tally: dict[tuple[str, str, str, str], int] = {}
        booting: dict[str, list[float]] = {}  # provider -> launch times of machines without a host
        counted: set[str] = set()  # instance refs already counted through a machine record
        draining: dict[str, int] = {}  # provider -> active machines asked to drain (planner.drain)
        active, returning = MachineState.ACTIVE, MachineState.RETURNING
        for machine in machines:
            state = machine.state
            if state is active:
                ref = machine.instance_ref
                counted.add(ref)
                if machine.drain_since > 0:
                    draining[machine.provider] = draining.get(machine.provider, 0) + 1
                host = hosts.get(ref) if ref else None
                if host is None:
                    name = "booting"
                    if machine.launch_time > 0:
                        booting.setdefault(machine.provider, []).append(machine.launch_time)
                else:
                    name = _HOST_STATE[host.status]
            elif state is returning:
                counted.add(machine.instance_ref)
                name = "returning"
            else:
                continue
            key = (machine.provider, machine.template_id, machine.demand_id, name)
            tally[key] = tally.get(key, 0) + 1
        for record in open_intents:
            intent = record.intent
            # A machine of an open intent whose instance fact is not in yet (a commit lost in a failover waits for
            # recovery) may have joined already: the controller's host says so; the others are still requested.
            pending = [ref for ref in intent.instance_refs if ref not in counted][: record.outstanding]
            names = [_HOST_STATE[host.status] for host in (hosts.get(ref) for ref in pending) if host is not None]
            names += ["requested"] * (record.outstanding - len(names))
            for name in names:
                key = (intent.provider, intent.template_id, intent.demand_id, name)
                tally[key] = tally.get(key, 0) + 1
        self.tally = tally
        self.draining = draining
        self.booting = {provider: sorted(times) for provider, times in booting.items()}
        self.spend = _SpendCurve(machines)


class _SpendCurve:
    """``planner.cost.estimate`` of a set of machines by provider and currency, at any ``now`` without walking
    them again: a live priced machine costs ``rate * max(0, now - launch) / HOUR``, so per (provider, currency) the
    launch times are kept sorted with running sums of ``rate`` and ``rate * launch``; the others (returned: ended
    at a known time; lost, unpriced: nothing) cost the same whatever ``now`` is and are summed once."""

    def __init__(self, machines: Iterable[MachineRecord]) -> None:
        fixed: dict[tuple[str, str], float] = {}
        live: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for machine in machines:
            quote = machine.price
            if not quote.known or quote.unit != "hour":
                continue
            key = (machine.provider, quote.currency)
            if machine.state.live and machine.launch_time > 0 and math.isfinite(quote.amount) and quote.amount >= 0:
                live.setdefault(key, []).append((machine.launch_time, quote.amount))
                continue
            spend = machine_spend(machine, 0.0)  # not live: ``now`` is not read
            if spend is not None:
                fixed[key] = fixed.get(key, 0.0) + spend[1]
        self.fixed = fixed
        #: (provider, currency) -> launch times sorted, and the sums of rate and rate * launch over the first k of
        #: them (arrays of doubles: 24 bytes a machine at 100,000 where lists of floats take 96).
        #: The launch times are summed relative to the earliest (``origin``), so the sums stay small numbers and
        #: ``now * R - W`` loses no precision to the size of epoch seconds.
        self.curves: dict[tuple[str, str], tuple[array[float], array[float], array[float]]] = {}
        self.origin = min((launch for points in live.values() for launch, _ in points), default=0.0)
        for key, points in live.items():
            points.sort()
            launches, rates, weighted = array("d"), array("d", [0.0]), array("d", [0.0])
            rate_sum = weighted_sum = 0.0
            for launch, rate in points:
                launches.append(launch)
                rate_sum += rate
                weighted_sum += rate * (launch - self.origin)
                rates.append(rate_sum)
                weighted.append(weighted_sum)
            self.curves[key] = (launches, rates, weighted)

    def at(self, now: float) -> list[dict[str, Any]]:
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite number of seconds, not {now!r}")
        totals = dict(self.fixed)
        hourly: dict[tuple[str, str], float] = {}
        for key, (launches, rates, weighted) in self.curves.items():
            k = bisect.bisect_right(launches, now)  # launched by now: the others cost nothing yet
            totals[key] = totals.get(key, 0.0) + ((now - self.origin) * rates[k] - weighted[k]) / HOUR
            hourly[key] = rates[k]
        # ``rate``: what the live priced machines cost per hour now (the metrics' spend counter integrates it).
        return [
            {"provider": p, "currency": c, "amount": round(a, 6), "rate": round(hourly.get((p, c), 0.0), 6)}
            for (p, c), a in sorted(totals.items())
        ]


class _Fleet:
    """Machines by provider and state, and demand wanted/supplied by offer, at ``wall_now``: a ``_Pass`` over the
    view (``passed``, or one made here) read against the demand snapshot, the providers and the join deadlines."""

    def __init__(
        self, view: ControllerView | None, wall_now: float, pieces: Pieces, passed: _Pass | None = None
    ) -> None:
        self.machines: dict[str, Counter[str]] = {name: Counter() for name in pieces.keepers}
        self.wanted: Counter[OfferKey] = Counter()
        self.supplied: Counter[OfferKey] = Counter()
        self.overdue: Counter[str] = Counter()  # booting past the provider's join deadline
        self.draining: Mapping[str, int] = {}  # provider -> active machines asked to drain
        self.wanted_total = self.unplaced = 0
        if view is None:
            return
        passed = _Pass.of(_Parts.of(view)) if passed is None else passed
        self.draining = passed.draining
        for provider, launches in passed.booting.items():
            deadline = pieces.policy.of(provider).join_deadline
            overdue = bisect.bisect_left(launches, wall_now - deadline)  # wall_now - launch > deadline
            if overdue:
                self.overdue[provider] = overdue
        serving: dict[str, Counter[OfferKey]] = {}
        for (provider, template, demand_id, name), n in passed.tally.items():
            self.machines.setdefault(provider, Counter())[name] += n
            if name in JOINED:
                self.supplied[(provider, template)] += n
            if name != "returning":
                serving.setdefault(demand_id, Counter())[(provider, template)] += n
        for item in view.demand.items if view.demand is not None else ():
            remaining = item.count
            self.wanted_total += item.count
            for offer, n in sorted(serving.get(item.demand_id, Counter()).items()):
                take = min(n, remaining)
                if take > 0:
                    self.wanted[offer] += take
                    remaining -= take
            self.unplaced += remaining

    def by_template(self, provider: str) -> dict[str, dict[str, int]]:
        keys = sorted({k for k in (*self.wanted, *self.supplied) if k[0] == provider})
        return {t: {"wanted": self.wanted[(p, t)], "supplied": self.supplied[(p, t)]} for p, t in keys}

    def readiness(self, provider: str) -> dict[str, str]:
        counts = self.machines.get(provider, Counter())
        joined = sum(counts[s] for s in JOINED)
        if self.overdue[provider]:
            return {"state": "failed", "detail": f"{self.overdue[provider]} machine(s) past the join deadline"}
        if counts["booting"]:
            return {"state": "pending", "detail": f"{counts['booting']} machine(s) booting, {joined} joined"}
        return {"state": "ok", "detail": f"{joined} machine(s) joined, none waiting"}


def _spend(view: ControllerView | None, wall_now: float) -> list[dict[str, Any]]:
    """Estimated spend so far by provider and currency (``planner.cost``; the metric
    ``provisionerd_estimated_spend_total`` integrates the ``rate`` of ``_SpendCurve.at``)."""
    if view is None:
        return []
    totals: dict[tuple[str, str], float] = {}
    for line in estimate(view.facts.machines.values(), wall_now).lines:
        key = (line.provider, line.currency)
        totals[key] = totals.get(key, 0.0) + line.amount
    return [{"provider": p, "currency": c, "amount": round(a, 6)} for (p, c), a in sorted(totals.items())]
