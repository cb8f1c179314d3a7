"""Why the plan does what it does, per demand item: what ``provisionerd explain`` and ``plan --what-if`` show.

Pure; no trio, no I/O. Nothing here decides anything: every figure and reason is read from one
:class:`provisionerd.planner.plan.Plan` (its ``DemandDecision`` per item with a deficit, its actions and notes) and
from the inputs that plan was made from. The rules that gave them are the planner's own
(:mod:`provisionerd.planner.allocate` for offers, :func:`provisionerd.planner.offers.reasons_for` for compatibility,
:func:`provisionerd.planner.outlook.item_surplus` and :func:`~provisionerd.planner.outlook.outlook` for the idle
machines an item gives away, and when).

Per item: ``wanted``, ``supplied`` (its active machines the plan counts), ``outstanding`` (machines its open intents
and requests in flight still owe), ``reused`` and ``requested`` by this plan, and ``unmet``. For what is unmet,
every offer with its verdict:

- ``requested`` / ``limited``: asked for, and for ``limited`` the limit that held the count (``maxNumber``,
  ``max_machines N/N``, a step limit), from ``DemandDecision.filled``;
- ``blocked``: compatible but skipped (capacity back-off until T, throttled until T, provider unhealthy since T,
  protected by ``max_unhealthy``, at ``maxNumber`` or ``max_machines N/N``, its step limit reached);
- ``untried``: compatible, never looked at because the global step window was full (until T);
- ``incompatible``: every attribute that does not fit, wanted vs offered;
- ``not_leased``: a provider this daemon does not hold the lease of (standby), so the plan was given none of its
  offers (the caller names these, with why).

When no offer is compatible, ``summary`` names the constraint no template meets (``no template offers gpus >= 1``).
For an item with more machines than it wants, ``surplus`` lists its idle machines the plan gives away: returned
now, due but waiting (the disruption budget, a throttle, an unhealthy provider: the plan's ``deferred`` notes), or
returned at ``idle since + idle_time``; its busy machines are never returned for the surplus.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set

import attrs

from provisionerd.domain.actions import DrainMachines, Note, RequestMachines, ReturnMachines
from provisionerd.domain.model import DemandItem, DemandSnapshot, HostState, HostStatus
from provisionerd.planner import headroom
from provisionerd.planner.allocate import DemandDecision
from provisionerd.planner.capacity import Unhealthy
from provisionerd.planner.fact_view import FactView, MachineRecord, MachineState
from provisionerd.planner.host_table import join_index
from provisionerd.planner.offers import Catalog, OfferKey, Requirement, cluster_cost, reasons_for, requirement_of
from provisionerd.planner.outlook import item_surplus, outlook
from provisionerd.planner.plan import Plan
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import PlannerState

#: Surplus machines listed per item at most (the count of the others is given).
MAX_SURPLUS = 50

REQUESTED, LIMITED, BLOCKED, UNTRIED, INCOMPATIBLE, NOT_LEASED = (
    "requested",
    "limited",
    "blocked",
    "untried",
    "incompatible",
    "not_leased",
)


@attrs.frozen
class OfferVerdict:
    """One offer considered for an item: ``verdict`` (see the module docstring), machines asked, and why."""

    provider: str
    template_id: str
    verdict: str
    count: int = 0
    reasons: tuple[str, ...] = ()
    #: The offer's priority (``providers[].priority`` / ``template_priority``; lower is used first, price orders
    #: offers within one): why a costlier offer was asked before a cheaper one, or a cloud only past a cap.
    priority: int = 0


@attrs.frozen
class SurplusMachine:
    """An idle machine an item gives away: ``when`` is ``now``, ``waits`` (due, held back: ``reason`` says by what)
    or ``at`` (``at``: wall seconds)."""

    machine_id: str
    provider: str
    when: str
    at: float | None
    reason: str


@attrs.frozen
class ItemExplanation:
    demand_id: str
    wanted: int
    supplied: int
    outstanding: int
    reused: int
    requested: int
    unmet: int
    summary: str
    offers: tuple[OfferVerdict, ...] = ()
    offers_more: int = 0  # offers not listed (``max_offers``), most of them incompatible
    surplus: tuple[SurplusMachine, ...] = ()
    surplus_more: int = 0
    surplus_busy: int = 0


@attrs.frozen
class Explanation:
    """The whole answer: per item, then the plan's actions and notes as one line each."""

    now: float
    items: tuple[ItemExplanation, ...]
    actions: tuple[str, ...]
    notes: tuple[str, ...]


def describe_action(action: object) -> str:
    """One line per planned action, as the operator reads it."""
    if isinstance(action, RequestMachines):
        return (
            f"request {action.count} x {action.provider}/{action.template_id} for {action.demand_id} ({action.op_id})"
        )
    if isinstance(action, ReturnMachines | DrainMachines):
        verb = "return" if isinstance(action, ReturnMachines) else "drain"
        shown = ", ".join(action.machine_ids[:8]) + (" ..." if len(action.machine_ids) > 8 else "")
        return f"{verb} {len(action.machine_ids)} on {action.provider} ({action.reason}): {shown} ({action.op_id})"
    op_id = getattr(action, "op_id", "")
    return f"{type(action).__name__} {getattr(action, 'provider', '')} ({op_id})"


def describe_note(note: Note) -> str:
    where = " ".join(part for part in (note.provider, note.demand_id) if part)
    return f"{note.kind}{f' [{where}]' if where else ''}: {note.detail}"


#: One constraint at a time: ``(label, the requirement with only that constraint kept)``.
def _alone(req: Requirement) -> list[tuple[str, Requirement]]:
    bare = Requirement(0, 0, 0, None, None, (), None, (), ())
    found: list[tuple[str, Requirement]] = []
    if req.ncpus > 1:
        found.append((f"ncpus >= {req.ncpus}", attrs.evolve(bare, ncpus=req.ncpus)))
    if req.mem_mb > 0:
        found.append((f"mem >= {req.mem_mb} MiB", attrs.evolve(bare, mem_mb=req.mem_mb)))
    if req.gpus > 0:
        found.append((f"gpus >= {req.gpus}", attrs.evolve(bare, gpus=req.gpus)))
    if req.gpu_type is not None:
        found.append((f"gpu_type {req.gpu_type}", attrs.evolve(bare, gpu_type=req.gpu_type)))
    if req.arch is not None:
        found.append((f"arch {req.arch}", attrs.evolve(bare, arch=req.arch)))
    for name, value in req.attributes:
        found.append((f"attribute {name}={value}", attrs.evolve(bare, attributes=((name, value),))))
    for name, value in req.placement:
        found.append((f"placement {name}={value}", attrs.evolve(bare, placement=((name, value),))))
    if req.providers:
        found.append((f"a provider in {list(req.providers)}", attrs.evolve(bare, providers=req.providers)))
    if req.cap is not None:
        kept = attrs.evolve(bare, cap=req.cap, currency=req.currency)
        found.append((f"a price <= {req.cap:g}/hour{f' {req.currency}' if req.currency else ''}", kept))
    return found


def unmet_constraints(req: Requirement, catalog: Catalog) -> list[str]:
    """The constraints of ``req`` that no offer of ``catalog`` meets on its own, by the planner's own rule."""
    return [label for label, alone in _alone(req) if all(reasons_for(alone, p) for p in catalog.ordered)]


def _offers(
    decision: DemandDecision,
    unleased: Mapping[tuple[str, str], str],
    untried_why: str,
    held: Callable[[OfferKey], str | None],
    unhealthy: Mapping[str, Unhealthy],
    limit: int | None,
) -> tuple[list[OfferVerdict], int]:
    """The offers' verdicts, most telling first, at most ``limit`` built (``None``: all), and how many there are."""
    total = (
        len(decision.requested)
        + len(decision.blocked)
        + len(decision.untried)
        + len(decision.incompatible)
        + len(unleased)
    )
    verdicts: list[OfferVerdict] = []
    room = total if limit is None else limit

    def add(verdict: OfferVerdict) -> bool:
        verdicts.append(verdict)
        return len(verdicts) < room

    limits = {(r.provider, r.template_id): r.reasons for r in decision.filled}
    for (provider, template_id), count in decision.requested:
        why = limits.get((provider, template_id), ())
        if not add(OfferVerdict(provider, template_id, LIMITED if why else REQUESTED, count, why)):
            return verdicts, total
    for r in decision.blocked:
        since = unhealthy.get(r.provider)
        extra = () if since is None else (f"unhealthy since {since.since:.1f}",)
        if not add(OfferVerdict(r.provider, r.template_id, BLOCKED, 0, (*r.reasons, *extra))):
            return verdicts, total
    for parsed in decision.untried:
        then = held(parsed.key)
        why = (untried_why,) if then is None else (untried_why, f"then {then}")
        if not add(OfferVerdict(parsed.key[0], parsed.key[1], UNTRIED, 0, why)):
            return verdicts, total
    for r in decision.incompatible:
        if not add(OfferVerdict(r.provider, r.template_id, INCOMPATIBLE, 0, r.reasons)):
            return verdicts, total
    for (p, t), standby in sorted(unleased.items()):
        if not add(OfferVerdict(p, t, NOT_LEASED, 0, (standby,))):
            return verdicts, total
    return verdicts, total


def _with_priorities(verdicts: list[OfferVerdict], catalog: Catalog) -> list[OfferVerdict]:
    """Each verdict with its offer's priority (read from the catalog the plan ranked offers by)."""
    return [attrs.evolve(v, priority=catalog.priority_of((v.provider, v.template_id))) for v in verdicts]


def step_window_until(state: PlannerState, now: float, policy: Policy) -> float | None:
    """When the global step window frees room again (the oldest step in it leaves), ``None``: it is empty."""
    steps = [e[0] for e in state.step_log if e[0] > now - policy.step_interval]
    return min(steps) + policy.step_interval if steps else None


def _summary(
    decision: DemandDecision,
    req: Requirement,
    catalog: Catalog,
    unleased: int,
    window_until: float | None,
    held: Callable[[OfferKey], str | None],
) -> str:
    if decision.unmet <= 0:
        return "served by this plan" if decision.requested or decision.reused else "nothing missing"
    if not decision.requested and not decision.blocked and not decision.untried:
        if decision.incompatible:
            missing = unmet_constraints(req, catalog)
            if missing:
                return "no template offers " + " and no template offers ".join(missing)
            return f"no template meets every constraint at once ({len(decision.incompatible)} offers incompatible)"
        if unleased:
            return f"no offers: the lease of their providers is not held here ({unleased} offers)"
        return "no offers known"
    reasons = [r for rejection in (*decision.filled, *decision.blocked) for r in rejection.reasons]
    if decision.untried:
        reasons.append(f"{_window(window_until)}: {len(decision.untried)} compatible offer(s) not tried")
        then = [h for h in (held(p.key) for p in decision.untried) if h is not None]
        if len(then) == len(decision.untried):  # room in the window would not help: say what stops them then
            reasons += [f"then {h}" for h in then]
    return "; ".join(dict.fromkeys(reasons)) or "no eligible offer with room"


def _window(until: float | None) -> str:
    return "global step window full" + ("" if until is None else f" until {until:.1f}")


def explain(
    result: Plan,
    snapshot: DemandSnapshot | None,
    facts: FactView,
    hosts: Mapping[str, HostState],
    catalog: Catalog,
    state: PlannerState,
    policy: Policy,
    now: float,
    *,
    unleased: Mapping[tuple[str, str], str] = {},  # noqa: B006 - read only
    retiring: Set[str] = frozenset(),
    only: str | None = None,
    max_offers: int | None = None,
    max_surplus: int = MAX_SURPLUS,
) -> Explanation:
    """See the module docstring. ``result`` is ``plan(state, snapshot, facts, catalog, hosts, now, policy, ...)``;
    ``unleased``: the offers of providers left out of ``catalog`` because this daemon holds no lease on them, and
    why; ``retiring``: machines with a return or lost mark in flight (``InFlight.retiring``); ``only``: one item;
    ``max_offers`` / ``max_surplus``: offers and surplus machines listed per item at most (the rest are counted)."""
    decisions = {d.demand_id: d for d in result.decisions}
    wanted: dict[str, int] = {}
    items: dict[str, DemandItem] = {}
    for item in () if snapshot is None else snapshot.items:
        wanted[item.demand_id] = wanted.get(item.demand_id, 0) + max(item.count, 0)
        items.setdefault(item.demand_id, item)
    # Warm headroom (planner.headroom): one item per rule, as plan() serves it, named ``headroom:<provider>/<t>``.
    warm = {} if snapshot is None else {w.demand_id: w for w in headroom.items(policy.headroom, now)}
    for demand_id, item in warm.items():
        wanted[demand_id] = max(item.count, 0)
        items[demand_id] = item
    leaving = _leaving(result, facts)
    deferred = {n.provider: n.detail for n in result.notes if n.kind == "deferred"}
    window_until = step_window_until(result.state, now, policy)
    leaving_by_item: dict[str, int] = {}  # the plan's own count: actions under way on active machines
    for machine_id in retiring:
        machine = facts.machines.get(machine_id)
        if machine is not None and machine.state is MachineState.ACTIVE:
            leaving_by_item[machine.demand_id] = leaving_by_item.get(machine.demand_id, 0) + 1
    surplus_of = _Surplus(facts, hosts, leaving, deferred, retiring, state, policy, now, snapshot is not None)
    surplus_of.limit = max_surplus
    unhealthy = state.capacity.unhealthy
    memo: dict[OfferKey, str | None] = {}  # an offer's hold is the same for every item of one plan

    def held(key: OfferKey) -> str | None:
        if key not in memo:
            memo[key] = decisions_held(key)
        return memo[key]

    decisions_held = result.decisions[0].held if result.decisions else (lambda _key: None)
    explained = []
    ids = sorted(set(wanted) | {d for d in facts.active_by_demand if d})
    for demand_id in ids if only is None else [only]:
        decision = decisions.get(demand_id)
        count = wanted.get(demand_id, 0)
        active = facts.active_by_demand.get(demand_id, 0) - leaving_by_item.get(demand_id, 0)
        if decision is None:
            line = ItemExplanation(demand_id, count, active, 0, 0, 0, 0, _no_deficit(demand_id, count, active, items))
        else:
            item = items[demand_id]
            req = requirement_of(item)
            if policy.cost_cap is not None or policy.cost_currency:  # as plan() does
                req = cluster_cost(requirement_of, policy.cost_cap, policy.cost_currency, item)
            line = ItemExplanation(
                demand_id,
                decision.wanted,
                decision.active,
                decision.outstanding,
                decision.reused,
                sum(n for _, n in decision.requested),
                decision.unmet,
                _summary(decision, req, catalog, len(unleased), window_until, held),
            )
            if demand_id in warm:
                line = attrs.evolve(line, summary=f"warm headroom (providers.headroom): {line.summary}")
            why = f"not tried: {_window(window_until)}"
            offers, total = _offers(decision, unleased, why, held, unhealthy, max_offers)
            offers = _with_priorities(offers, catalog)
            line = attrs.evolve(line, offers=tuple(offers), offers_more=total - len(offers))
        if active > count:
            line = surplus_of(line, active, count)
        explained.append(line)
    return Explanation(
        now,
        tuple(explained),
        tuple(describe_action(a) for a in result.actions),
        tuple(describe_note(n) for n in result.notes),
    )


def _no_deficit(demand_id: str, count: int, active: int, items: Mapping[str, object]) -> str:
    if demand_id.startswith(headroom.PREFIX):
        rule = f"warm headroom of {demand_id.removeprefix(headroom.PREFIX)}: keeps {count} idle machine(s) joined"
        return rule + (" (outside its hours: none now)" if count == 0 else "") + f", has {active}"
    if demand_id not in items:
        return f"not in the demand: its {active} machine(s) are surplus"
    if active > count:
        return f"surplus: {active - count} machine(s) more than wanted"
    return "nothing missing (supplied, or owed by requests under way)"


def _leaving(result: Plan, facts: FactView) -> dict[str, str]:
    """machine_id -> what this plan does to it now (``return (idle)``, ``drain (max_ttl)``)."""
    found: dict[str, str] = {}
    for action in result.actions:
        if isinstance(action, ReturnMachines | DrainMachines):
            verb = "return" if isinstance(action, ReturnMachines) else "drain"
            for machine_id in action.machine_ids:
                found[machine_id] = f"{verb} now ({action.reason}, {action.op_id})"
    return found


class _Surplus:
    """The surplus part of an item's explanation; the fleet-wide indexes it needs are built once, when first used."""

    def __init__(
        self,
        facts: FactView,
        hosts: Mapping[str, HostState],
        leaving: Mapping[str, str],
        deferred: Mapping[str, str],
        retiring: Set[str],
        state: PlannerState,
        policy: Policy,
        now: float,
        known: bool,
    ) -> None:
        self.facts, self.hosts, self.leaving, self.deferred = facts, hosts, leaving, deferred
        self.retiring, self.state, self.policy, self.now, self.known = retiring, state, policy, now, known
        self._available: Mapping[str, Mapping[str, tuple[HostState, MachineRecord]]] | None = None
        self._busy: dict[str, int] | None = None
        self.limit = MAX_SURPLUS

    def __call__(self, line: ItemExplanation, active: int, count: int) -> ItemExplanation:
        if not self.known:
            return attrs.evolve(
                line, summary=line.summary + " (no demand snapshot yet: nothing is returned for idling)"
            )
        if self._available is None:
            self._available = join_index(self.facts.active_refs, self.hosts).available
            self._busy = {}
            for ref, machine in self.facts.active_refs.items():
                host = self.hosts.get(ref)
                if host is not None and host.status is HostStatus.BUSY:
                    self._busy[machine.demand_id] = self._busy.get(machine.demand_id, 0) + 1
        demand_id, state, now = line.demand_id, self.state, self.now
        available = list(self._available.get(demand_id, {}).values())
        drained = [m for m in self.facts.drained.values() if m.demand_id == demand_id]
        chosen = item_surplus(
            available,
            drained,
            self.hosts,
            active=active,
            wanted=count,
            skip=self.retiring,
            machine_seen=state.machine_seen,
            drain_seen=state.drain_seen,
            now=now,
            policy=self.policy,
        )
        listed = [s for s in (self._machine(machine_id) for machine_id in chosen) if s is not None]
        listed.sort(key=lambda s: (s.at if s.at is not None else float("inf"), s.machine_id))
        return attrs.evolve(
            line,
            surplus=tuple(listed[: self.limit]),
            surplus_more=max(len(listed) - self.limit, 0),
            surplus_busy=(self._busy or {}).get(demand_id, 0),
        )

    def _machine(self, machine_id: str) -> SurplusMachine | None:
        machine = self.facts.machines.get(machine_id)
        if machine is None or machine.state is not MachineState.ACTIVE:
            return None
        if machine_id in self.leaving:
            return SurplusMachine(machine_id, machine.provider, "now", self.now, self.leaving[machine_id])
        seen = outlook(
            machine,
            self.hosts.get(machine.instance_ref),
            self.policy.of(machine.provider),
            self.now,
            machine_seen=self.state.machine_seen,
            drain_seen=self.state.drain_seen,
            surplus=True,
        )
        if seen.at is not None and seen.at <= self.now:
            why = self.deferred.get(machine.provider, "due: returned at the next plan")
            return SurplusMachine(machine_id, machine.provider, "waits", seen.at, why)
        return SurplusMachine(machine_id, machine.provider, "at", seen.at, f"{seen.reason}, {seen.rule}")
