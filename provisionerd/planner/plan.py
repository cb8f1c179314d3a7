"""The level-triggered planner: ``plan(state, snapshot, view, offers, hosts, now, policy) -> Plan``.

Pure and synchronous: no I/O, no trio, ``now`` passed in (wall-clock seconds, the clock of ``launch_time`` and
``HostState.since``). Given the same inputs it returns the same plan.

Rules
- A snapshot with a lower seq than the highest applied is ignored: the plan is empty and says so in its notes.
  An equal seq is a replay and is planned normally (level-triggered: it plans only what is still missing).
- Per demand item: ``active`` = its usable machines (see :mod:`provisionerd.planner.supply` for attribution);
  ``outstanding`` = machines its open intents and in-flight requests still owe. The item keeps
  ``min(active, count)`` machines; ``deficit = count - kept - outstanding``. A deficit is filled first by
  reusing idle machines other items no longer need (compatible templates, cheapest first), then by requests
  (:mod:`provisionerd.planner.allocate`).
- Requests go to the item's compatible offers in choice order (:mod:`provisionerd.planner.offers`), skipping offers that
  are out of capacity, on a throttled or unhealthy provider, at ``maxNumber``, at the provider cap or at the
  provider's own step limit, and spilling over to the next offer when one fills. At most ``policy.step_limit``
  machines per sliding ``policy.step_interval`` over all providers; items are served in demand_id order. A
  provider's own step limit is the floor of its adaptive step (:mod:`provisionerd.planner.ramp`: it doubles per
  accepted round while demand uses all of it, halves on ``capacity_unavailable`` or ``throttled``, up to its
  ``max_machines``); the global limit grows by what the ramps added. Caps
  count every live machine (returning ones included), every open intent's missing machines and every request in
  flight, so they hold even before the facts of this plan's actions land.
- Retirement: reclaimed machines are marked lost; not-joined machines of a timed-out intent, machines past the
  join deadline, joined machines whose capability report falls short of their template (``capability_mismatch:
  <why>``; their offer turns suspect, :mod:`provisionerd.planner.health`) and idle machines past ``max_ttl`` are
  returned; idle machines an item does not need (and no other item reuses) are returned once idle for
  ``idle_time``, longest idle first. A busy machine past ``max_ttl`` is asked to drain (``DrainMachines``) and
  returned when idle or at its ``drain_timeout`` (:mod:`provisionerd.planner.drain`); no other busy machine is
  ever returned. Returns wait while their provider is throttled or unhealthy (but not for ``quota_exceeded``).
- Every action planned is remembered in the state until the facts show it (or the driver reports it dropped),
  so replaying the same snapshot against the same view plans nothing new. Committing the planned facts changes
  nothing either, except that a committed ``RequestFailed`` or ``Lost`` frees what the plan held for it.
- Health (:mod:`provisionerd.planner.health`): lost, never-joined, timed-out and short machines are logged as
  unhealthy; a provider with more than its ``max_unhealthy`` of them within ``max_unhealthy_window`` gets no new
  request (note ``provider_protected``) until the window holds no more than that.
- Every deadline, back-off, cap and step limit is the machine's, intent's or offer's own provider's
  (``policy.of(provider)``, :class:`provisionerd.planner.policy.ProviderPolicy`).
- Action order: ``FailRequest``, ``MarkLost``, ``ReturnMachines`` (per provider, by reason, batched),
  ``DrainMachines``, then ``RequestMachines`` (retire before acquiring).

op_id scheme: ``"<cluster>:<provider>:<incarnation>:<n>"`` with ``n`` the state's op counter, which only grows.
``incarnation`` differs per process start (see :class:`provisionerd.planner.state.PlannerState`); any candidate
already used by a request or return in the facts, or in flight, is skipped. ``FailRequest`` reuses the intent's
op_id, since ``RequestFailed`` closes that intent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping

import attrs

from provisionerd.domain.actions import (
    Action,
    DrainMachines,
    FailRequest,
    MarkLost,
    Note,
    RequestMachines,
    ReturnMachines,
)
from provisionerd.domain.model import NO_QUOTE, DemandSnapshot, HostState, Offer
from provisionerd.planner import budget, gang, headroom, health
from provisionerd.planner.allocate import Allocator, DemandDecision, excess_pool
from provisionerd.planner.budget import VOLUNTARY
from provisionerd.planner.demand_index import demand_index
from provisionerd.planner.drain import DRAIN_REASON, DRAIN_TIMEOUT, DRAINED, RECLAIM, RECLAIM_DEADLINE
from provisionerd.planner.fact_view import FactView, MachineRecord, MachineState
from provisionerd.planner.idle_pool import IdlePool
from provisionerd.planner.in_flight import NOTHING_IN_FLIGHT, InFlight
from provisionerd.planner.offers import Catalog, cluster_cost, format_key
from provisionerd.planner.policy import Policy
from provisionerd.planner.ramp import Planned
from provisionerd.planner.rejoin import NO_HOST, NOT_REJOINED, SETTLED, Rejoin
from provisionerd.planner.release import RELEASED, release_completed
from provisionerd.planner.state import PlannerState, ReclaimNotice, advance_ramp
from provisionerd.planner.supply import Tally, tally

__all__ = ["DemandDecision", "Plan", "plan"]

#: Order in which retire reasons are emitted (and a machine's single reason, see
#: :func:`provisionerd.planner.supply.tally`).
RETIRE_REASONS = (
    RECLAIM_DEADLINE,
    RECLAIM,
    gang.ALL_OR_NOTHING,
    "provisioning_timeout",
    "never_joined",
    NOT_REJOINED,
    NO_HOST,
    health.CAPABILITY_MISMATCH,
    health.UNHEALTHY_AFTER_JOIN,
    DRAIN_TIMEOUT,
    "max_ttl",
    DRAINED,
    RELEASED,
    "idle",
)


#: Retire reasons whose ``ReturnIntent.reason`` says what the machine fell short of (``health.mismatch_reason``).
SHORT_OF_TEMPLATE = (health.CAPABILITY_MISMATCH, health.UNHEALTHY_AFTER_JOIN)


@attrs.frozen
class Plan:
    actions: tuple[Action, ...]
    state: PlannerState
    notes: tuple[Note, ...] = ()
    decisions: tuple[DemandDecision, ...] = ()
    #: The earliest time after ``now`` at which this plan's inputs, unchanged, would plan something new (an idle
    #: machine reaching its ``idle_time``, a join deadline, a ``max_ttl``, a provisioning timeout, a full step window
    #: freeing room); ``None``: none. Found on the plan's own pass: no extra scan (``planner.deadlines``).
    wake_at: float | None = None
    #: Machines would retire for not joining, but the hosts were not confirmed by a fresh resync: ask for one and
    #: plan again (``Rejoin.hosts_confirmed``, :mod:`provisionerd.planner.rejoin`).
    confirm_joins: bool = False


class _OpIds:
    """Fresh op_ids from the state's counter, skipping any the facts or in-flight actions already use."""

    def __init__(self, state: PlannerState, view: FactView, policy: Policy, pending: InFlight) -> None:
        self.next = state.next_op
        self._prefix = f"{policy.cluster}:"
        self._suffix = f":{state.incarnation}:"
        self._taken = (view.intents, view.returns, pending.requests)

    def new(self, provider: str) -> str:
        while True:
            op_id = f"{self._prefix}{provider}{self._suffix}{self.next}"
            self.next += 1
            if not any(op_id in taken for taken in self._taken):
                return op_id


def _as_hosts(hosts: Mapping[str, HostState] | Iterable[HostState]) -> Mapping[str, HostState]:
    if isinstance(hosts, Mapping):
        return hosts
    return {host.instance_ref: host for host in hosts}


def plan(
    state: PlannerState,
    snapshot: DemandSnapshot | None,
    view: FactView,
    offers: Catalog | Iterable[Offer],
    hosts: Mapping[str, HostState] | Iterable[HostState],
    now: float,
    policy: Policy,
    rejoin: Rejoin = SETTLED,
    in_flight: InFlight = NOTHING_IN_FLIGHT,
) -> Plan:
    """Plan the smallest set of actions that moves the facts toward ``snapshot``. See the module docstring.

    ``snapshot`` ``None`` means no demand is known yet (e.g. between a resync and its snapshot): retirement by
    deadline and reclaim still runs, but nothing is requested and nothing is returned for being idle.
    ``hosts`` is keyed by instance_ref (or any iterable of host states). Pass a :class:`Catalog` to reuse parsed
    offers and cached rankings across calls. ``rejoin``: the settle window after the last (re)join to the
    controller and the machines known to have joined (:mod:`provisionerd.planner.rejoin`; default: settled, none
    known). ``in_flight``: the actions this process planned before that are still under way (the op book's,
    :mod:`provisionerd.planner.in_flight`); those the facts do not show yet are not planned again. Raises
    ``ValueError`` when ``now`` is not finite.
    """
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite number of seconds, not {now!r}")
    if snapshot is not None and snapshot.seq < state.applied_seq:
        detail = f"snapshot seq {snapshot.seq} is older than applied seq {state.applied_seq}: ignored"
        return Plan((), state, (Note("stale_snapshot", detail),))
    catalog = (
        offers
        if isinstance(offers, Catalog)
        else Catalog(offers, policy.priorities, policy.template_priorities, policy.unverified)
    )
    notes = [Note("duplicate_offer", f"duplicate offer {format_key(k)} ignored", k[0]) for k in catalog.duplicates]
    pending, committed = in_flight.unseen(view)
    if committed:  # a committed request's age carries over to its intent
        state = attrs.evolve(state, intent_seen={**state.intent_seen, **committed})
    demand = None if snapshot is None else demand_index(snapshot)
    if demand is not None:
        notes.extend(demand.notes)
    wanting: Mapping[str, int] | None = None if demand is None else demand.wanted
    # Warm headroom (planner.headroom): one item per rule, served after the real ones; the tally lists every idle
    # machine of it (wanted 0 there) so that all of them can be lent.
    warm = headroom.items(policy.headroom, now) if demand is not None else ()
    warm_items = {item.demand_id: item for item in warm}
    if warm and wanting is not None:
        wanting = headroom.WantedWith(dict.fromkeys(warm_items, 0), wanting)
    # The items over and short of what the snapshot wants, kept by the view between passes (planner.demand_balance).
    over = None if demand is None else view.balance.over(demand.wanted)
    if over is not None and warm_items:
        over = over | warm_items.keys()  # a warm item wants none (headroom.WantedWith)
    counts = tally(
        state, view, _as_hosts(hosts), now, policy, wanting, health.CapabilityCheck(catalog), rejoin, pending, over
    )
    state, blocked = _health(state, view, counts, now, policy, notes)
    planner = Allocator(state, catalog, counts, now, policy, blocked)
    idle_pool = IdlePool()
    released: list[tuple[str, MachineRecord]] = []
    if demand is None:
        notes.append(Note("no_snapshot", "no demand snapshot yet: no requests, no idle returns"))
    else:
        released = release_completed(counts, view, demand.reservations)  # before reuse: nobody else takes them
        listed = {h: len(counts.idle.get(h, ())) for h in warm_items}
        idle_pool = excess_pool(counts, demand.items, policy, lend=warm_items)
        requirement = demand.requirement
        if policy.cost_cap is not None or policy.cost_currency:
            requirement = functools.partial(cluster_cost, demand.requirement, policy.cost_cap, policy.cost_currency)
        active, outstanding = counts.active, counts.outstanding
        # Only items with a deficit have anything to serve, and only an item the view has short, or one this pass
        # lowered, can have one (outstanding machines only cover a deficit): in demand_id order, the snapshot's.
        wanted_of = demand.wanted
        for demand_id in sorted(view.balance.short(wanted_of) | (counts.lowered & wanted_of.keys())):
            if active.get(demand_id, 0) + outstanding.get(demand_id, 0) < wanted_of[demand_id]:
                planner.serve(demand.items[demand_id], idle_pool, notes, requirement)
        if warm_items:
            wanted_warm = {h: max(item.count, 0) for h, item in warm_items.items()}
            headroom.settle_pool(idle_pool, listed, active, wanted_warm, warm_items)
            for h, item in warm_items.items():
                if active.get(h, 0) + outstanding.get(h, 0) < wanted_warm[h]:
                    planner.serve(item, IdlePool(), notes)  # takes what the real items left; lends, never borrows
    # (provider, reason, machine_id) of every machine to return, grouped and batched by _emit.
    retire = [(m.provider, _reason(r, m, counts), m.machine_id) for r, m in counts.retire]
    retire += [(m.provider, reason, m.machine_id) for reason, m in released]
    for provider, entries in idle_pool.due(now, lambda p: policy.of(p).idle_time, counts.due).items():
        if budget.allowance(policy.of(provider), 0) is not None:
            entries.sort()  # longest idle first over all of the provider's offers (the budget lets the first go)
        retire += [(provider, "idle", entry[1]) for entry in entries]  # no record read: the entry has the id
    return _emit(state, view, pending, counts, planner, retire, notes, snapshot, now, policy)


def _reason(reason: str, machine: MachineRecord, counts: Tally) -> str:
    """A retire reason as the return names it: what the machine fell short of, for the two reasons that say so."""
    return (
        health.mismatch_reason(counts.shortfalls[machine.machine_id], reason) if reason in SHORT_OF_TEMPLATE else reason
    )


def _emit(
    state: PlannerState,
    view: FactView,
    pending: InFlight,
    counts: Tally,
    planner: Allocator,
    retire: list[tuple[str, str, str]],
    notes: list[Note],
    snapshot: DemandSnapshot | None,
    now: float,
    policy: Policy,
) -> Plan:
    """Name the actions (fresh op_ids) and build the next state (the op book keeps the actions as in flight)."""
    ops = _OpIds(state, view, policy, pending)
    actions: list[Action] = []
    for record in counts.fails:
        intent = record.intent
        actions.append(FailRequest(intent.op_id, intent.provider, "provisioning_timeout"))
    for machine in sorted(counts.lost, key=lambda m: m.machine_id):
        op_id = ops.new(machine.provider)
        actions.append(MarkLost(op_id, machine.provider, machine.machine_id, "reclaimed"))
    rooms: dict[str, int | None] = {}  # provider -> voluntary returns it may still have now (planner.budget)
    spent: dict[str, int] = {}
    live = view.live_by_provider
    groups: dict[tuple[str, str], list[str]] = {}
    for provider, reason, machine_id in retire:
        groups.setdefault((provider, reason), []).append(machine_id)
    order = {reason: i for i, reason in enumerate(RETIRE_REASONS)}
    by_order = sorted(groups.items(), key=lambda g: (g[0][0], order[health.reason_kind(g[0][1])], g[0][1]))
    for (provider, reason), machine_ids in by_order:
        unhealthy = state.capacity.unhealthy.get(provider)
        if unhealthy is not None and unhealthy.blocks_returns:
            detail = f"{len(machine_ids)} {reason} return(s) wait: {unhealthy.reason(provider)}"
            notes.append(Note("deferred", detail, provider))
            continue
        until = state.capacity.throttled(provider, now)
        if until is not None:
            detail = f"{len(machine_ids)} {reason} return(s) wait for the throttle until {until:.1f}"
            notes.append(Note("deferred", detail, provider))
            continue
        if reason in VOLUNTARY:
            machine_ids = _budgeted(
                provider, reason, machine_ids, rooms, spent, live, state, now, policy, counts, notes
            )
            if not machine_ids:
                continue
        machine_ids.sort()
        for start in range(0, len(machine_ids), policy.return_batch):
            batch = tuple(machine_ids[start : start + policy.return_batch])
            op_id = ops.new(provider)
            actions.append(ReturnMachines(op_id, provider, batch, reason))
    drain_seen = _drains(state, view, counts, ops, actions, (rooms, spent, live), now, policy, notes)
    step_used: dict[str, int] = {}
    asked: dict[str, list[str]] = {provider: [] for provider in sorted(planner.saturated)}
    items = {} if snapshot is None else demand_index(snapshot).items
    for demand_id, (provider, template_id), count in planner.requests:
        op_id = ops.new(provider)
        item = items.get(demand_id)
        reservation, release = ("", "") if item is None else (item.reservation, item.release)
        whole = item is not None and item.all_or_nothing
        chosen = planner.catalog.by_key.get((provider, template_id))
        price = chosen.offer.price if chosen is not None and chosen.offer.price is not None else NO_QUOTE
        actions.append(
            RequestMachines(op_id, provider, template_id, count, demand_id, reservation, release, price, whole)
        )
        step_used[provider] = step_used.get(provider, 0) + count
        asked.setdefault(provider, []).append(op_id)
    step_log = planner.step_log + tuple((now, provider, n) for provider, n in sorted(step_used.items()))
    ramps = state.ramps
    for provider, op_ids in asked.items():  # the requests each step asked, and whether demand used all of it
        ramps = advance_ramp(ramps, provider, Planned(tuple(op_ids), provider in planner.saturated), policy)
    new_state = attrs.evolve(
        state,
        applied_seq=state.applied_seq if snapshot is None else max(state.applied_seq, snapshot.seq),
        next_op=ops.next,
        intent_seen=counts.intent_seen,
        machine_seen=counts.machine_seen,
        reclaimed=_prune_reclaimed(state.reclaimed, view, now, policy, notes),
        step_log=step_log,
        ramps=ramps,
        capacity=state.capacity.pruned(now),
        disruptions=budget.recorded(state.disruptions, spent, now, policy) if state.disruptions or spent else (),
        drain_seen=drain_seen,
    )
    if step_log and (planner.saturated or planner.step_room <= 0):  # room comes back as the window slides
        counts.due(min(e[0] for e in step_log) + policy.step_interval, now)
    wake_at = counts.wake if math.isfinite(counts.wake) else None
    return Plan(tuple(actions), new_state, tuple(notes), tuple(planner.decisions), wake_at, counts.unconfirmed > 0)


def _health(
    state: PlannerState, view: FactView, counts: Tally, now: float, policy: Policy, notes: list[Note]
) -> tuple[PlannerState, dict[str, str]]:
    """Log this pass's unhealthy findings, mark the offers of machines short of their template suspect, and name
    the providers protected by ``max_unhealthy`` (``planner.health``): ``(state, {provider: why})``."""
    findings = [(m.provider, m.machine_id) for m in counts.lost]
    findings += [(m.provider, m.machine_id) for r, m in counts.retire if r in health.UNHEALTHY_REASONS]
    findings += [(m.provider, m.machine_id) for m in counts.unhealthy_drain]  # found now, returned when idle
    findings.sort()  # the log's order must not depend on set iteration (hash seeds)
    capacity = state.capacity
    for machine_id, reasons in sorted(counts.shortfalls.items()):
        machine = view.machines[machine_id]
        if machine_id in counts.after_join:  # the machine degraded: its offer is not suspect, max_unhealthy counts it
            why = f"machine {machine_id} fell short of its template after it joined: {'; '.join(reasons)}"
            notes.append(Note(health.UNHEALTHY_AFTER_JOIN, why, machine.provider, machine.demand_id))
            continue
        why = f"machine {machine_id} short of its template: {'; '.join(reasons)}"
        notes.append(Note(health.CAPABILITY_MISMATCH, why, machine.provider, machine.demand_id))
        until = now + policy.of(machine.provider).capacity_backoff
        capacity = capacity.with_suspect((machine.provider, machine.template_id), until, why[:200])
    for until, _ in capacity.suspect.values():  # the plan wakes when an offer stops being suspect
        counts.due(until, now)
    if not findings and not state.unhealthy:
        return (state if capacity is state.capacity else attrs.evolve(state, capacity=capacity)), {}
    providers = {p for p, _ in findings} | {e[1] for e in state.unhealthy}
    windows = {p: policy.of(p).max_unhealthy_window for p in providers}
    log = health.recorded(state.unhealthy, findings, now, windows)
    live = view.live_by_provider
    blocked: dict[str, str] = {}
    for provider, found in health.protections(log, live, now, policy.of).items():
        blocked[provider] = found.reason()
        notes.append(Note("provider_protected", found.reason(), provider))
        counts.due(found.eases_at, now)
    return attrs.evolve(state, capacity=capacity, unhealthy=log), blocked


def _budgeted(
    provider: str,
    reason: str,
    machine_ids: list[str],
    rooms: dict[str, int | None],
    spent: dict[str, int],
    live: Mapping[str, int],
    state: PlannerState,
    now: float,
    policy: Policy,
    counts: Tally,
    notes: list[Note],
) -> list[str]:
    """The voluntary returns of one (provider, reason) group the provider's disruption budget lets go now, in
    the group's order (longest idle first for ``idle``); the rest wait with a ``deferred`` note, and the plan
    wakes when the window frees room."""
    own = policy.of(provider)
    if provider not in rooms:
        rooms[provider] = budget.room(state.disruptions, provider, live.get(provider, 0), now, own)
    left = rooms[provider]
    if left is None:
        return machine_ids
    allowed, waiting = machine_ids[:left], len(machine_ids) - left
    rooms[provider] = left - len(allowed)
    spent[provider] = spent.get(provider, 0) + len(allowed)
    if waiting > 0:
        log = state.disruptions + ((now, provider, spent[provider]),)
        again = budget.room_returns_at(log, provider, now, own)
        # The figures (provisionerd explain): the budget, what the window holds, and when room comes back.
        allowance = budget.allowance(own, live.get(provider, 0))
        figures = f" ({allowance} per {own.disruption_interval:g}s, all used)"
        until = "" if again is None else f" until {again:.1f}"
        detail = f"{waiting} {reason} return(s) wait for the disruption budget{figures}{until}"
        notes.append(Note("deferred", detail, provider))
        if again is not None:
            counts.due(again, now)
    return allowed


def _drains(
    state: PlannerState,
    view: FactView,
    counts: Tally,
    ops: _OpIds,
    actions: list[Action],
    budgets: tuple[dict[str, int | None], dict[str, int], Mapping[str, int]],
    now: float,
    policy: Policy,
    notes: list[Note],
) -> Mapping[str, float]:
    """Ask the busy machines past ``max_ttl`` to drain (``planner.drain``), one ``DrainMachines`` per provider and
    batch, as far as the disruption budget lets (the ask is the voluntary disruption); ``PlannerState.drain_seen``
    after it (entries of machines no longer active dropped)."""
    machines = view.machines
    seen = state.drain_seen
    if seen:
        seen = {m: t for m, t in seen.items() if m in machines and machines[m].state is MachineState.ACTIVE}
    groups: dict[str, list[str]] = {}
    for machine in counts.drain:
        groups.setdefault(machine.provider, []).append(machine.machine_id)
    for provider, machine_ids in sorted(groups.items()):
        machine_ids = _budgeted(provider, "drain", machine_ids, *budgets, state, now, policy, counts, notes)
        machine_ids.sort()
        if machine_ids:
            counts.due(now + policy.of(provider).drain_timeout, now)  # returned then, busy or not
        for start in range(0, len(machine_ids), policy.return_batch):
            batch = tuple(machine_ids[start : start + policy.return_batch])
            actions.append(DrainMachines(ops.new(provider), provider, batch, DRAIN_REASON, now))
            seen = {**seen, **dict.fromkeys(batch, now)}
    # A reclaim notice, or a machine unhealthy after its join: never budgeted (not a choice of ours).
    for reason, found in ((RECLAIM, counts.notice_drain), (health.UNHEALTHY_AFTER_JOIN, counts.unhealthy_drain)):
        unbudgeted: dict[str, list[str]] = {}
        for machine in found:
            unbudgeted.setdefault(machine.provider, []).append(machine.machine_id)
        for provider, machine_ids in sorted(unbudgeted.items()):
            machine_ids.sort()
            counts.due(now + policy.of(provider).drain_timeout, now)
            for start in range(0, len(machine_ids), policy.return_batch):
                batch = tuple(machine_ids[start : start + policy.return_batch])
                actions.append(DrainMachines(ops.new(provider), provider, batch, reason, now))
                seen = {**seen, **dict.fromkeys(batch, now)}
    return seen


def _prune_reclaimed(
    reclaimed: Mapping[str, ReclaimNotice], view: FactView, now: float, policy: Policy, notes: list[Note]
) -> dict[str, ReclaimNotice]:
    """Keep notices for machines still active, or not in the facts yet and noticed recently."""
    kept: dict[str, ReclaimNotice] = {}
    for machine_id, notice in reclaimed.items():
        machine = view.machines.get(machine_id)
        if machine is None:
            if now - notice.at < policy.reclaim_memory:
                kept[machine_id] = notice
            else:
                detail = f"reclaim notice for unknown machine {machine_id!r} dropped"
                notes.append(Note("unknown_reclaim", detail, notice.provider))
        elif machine.state is MachineState.ACTIVE:
            kept[machine_id] = notice
    return kept
