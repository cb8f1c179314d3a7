"""One pass over the facts: what each demand item has, what each offer and provider carries, what must retire.

Pure; part of :func:`provisionerd.planner.plan.plan`, split out because it is the part that grows with the number of
machines, and is written to stay fast at 100,000 of them by reading the indexes :class:`FactView` keeps.

Attribution: a machine serves the demand item named by its intent's ``demand_id`` (``MachineRecord.demand_id``;
machines without an intent, such as adopted orphans, serve the empty demand id, which no snapshot item can have).
The same goes for an open intent's outstanding machines.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, MutableMapping, Sequence

import attrs

from provisionerd.domain.model import HostState
from provisionerd.planner import drain, gang
from provisionerd.planner.fact_view import FactView, IntentRecord, MachineRecord, MachineState
from provisionerd.planner.health import CAPABILITY_MISMATCH, UNHEALTHY_AFTER_JOIN, CapabilityCheck
from provisionerd.planner.host_table import HostTable, IdleEntry, join_index
from provisionerd.planner.in_flight import NOTHING_IN_FLIGHT, InFlight
from provisionerd.planner.offers import OfferKey
from provisionerd.planner.policy import Policy
from provisionerd.planner.rejoin import SETTLED, Rejoin, Window
from provisionerd.planner.state import PlannerState

__all__ = ["IdleEntry", "Tally", "tally"]


class Supply(MutableMapping[str, int]):
    """demand_id -> usable machines this pass: the view's ACTIVE counts (``FactView.active_by_demand``, read, not
    copied: at 10,000 items a copy cost 0.7 ms, each entry a cache miss), less what the pass takes out."""

    __slots__ = ("_base", "_own")

    def __init__(self, base: Mapping[str, int]) -> None:
        self._base = base
        self._own: dict[str, int] = {}  # the counts this pass set

    def __getitem__(self, demand_id: str) -> int:
        own = self._own
        return own[demand_id] if demand_id in own else self._base[demand_id]

    def get(self, demand_id: str, default: int | None = None) -> int | None:  # type: ignore[override]
        own = self._own
        return own[demand_id] if demand_id in own else self._base.get(demand_id, default)

    def __contains__(self, demand_id: object) -> bool:
        return demand_id in self._own or demand_id in self._base

    def __setitem__(self, demand_id: str, n: int) -> None:
        self._own[demand_id] = n

    def __delitem__(self, demand_id: str) -> None:
        raise TypeError("a pass lowers supply, it never forgets an item")

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        yield from (d for d in self._own if d not in self._base)

    def __len__(self) -> int:
        return len(self._base) + sum(1 for d in self._own if d not in self._base)

    def __repr__(self) -> str:
        return f"Supply({dict(self)!r})"


@attrs.define
class Tally:
    """Mutable working numbers for one plan call (never escapes it)."""

    load: dict[OfferKey, int] = attrs.field(factory=dict)  # live machines + outstanding + pending, per offer
    provider_loads: dict[str, int] = attrs.field(factory=dict)  # ``load`` summed per provider
    outstanding: dict[str, int] = attrs.field(factory=dict)  # demand_id -> machines still to come
    #: demand_id -> usable machines (not retiring).
    active: MutableMapping[str, int] = attrs.field(factory=dict)
    #: demand_id -> joined idle machines (``IdleEntry``), longest idle first, ties by machine id. Read only: the
    #: host table's kept lists where nothing was filtered out (replace an item's list to change it).
    idle: dict[str, Sequence[IdleEntry]] = attrs.field(factory=dict)
    #: demand_id -> the one offer all of its ``idle`` machines are of, where the host table knows it.
    idle_offer: dict[str, OfferKey] = attrs.field(factory=dict)
    retire: list[tuple[str, MachineRecord]] = attrs.field(factory=list)  # (reason, machine) to return
    #: machine_id -> why its host's report falls short of its template (retired as ``capability_mismatch``).
    shortfalls: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    lost: list[MachineRecord] = attrs.field(factory=list)  # reclaimed by the provider
    fails: list[IntentRecord] = attrs.field(factory=list)  # open intents past the provisioning timeout
    drain: list[MachineRecord] = attrs.field(factory=list)  # busy past max_ttl, to be asked to drain (planner.drain)
    #: Busy with a reclaim notice, to be asked to drain (``planner.drain.noticed``; never budgeted).
    notice_drain: list[MachineRecord] = attrs.field(factory=list)
    #: Busy, and a re-probe after the join falls short of the template: to be asked to drain (never budgeted), then
    #: returned when idle as ``unhealthy_after_join`` (``planner.health``).
    unhealthy_drain: list[MachineRecord] = attrs.field(factory=list)
    #: Machines whose shortfall a re-probe after the join found (``shortfalls`` has why): their offer is not
    #: suspect (the machine degraded, not the template's kind of machine).
    after_join: set[str] = attrs.field(factory=set)
    intent_seen: dict[str, float] = attrs.field(factory=dict)
    machine_seen: dict[str, float] = attrs.field(factory=dict)
    #: The earliest deadline after ``now`` found on the way (a provisioning timeout, a join deadline, a max_ttl):
    #: the plan that ran at ``now`` would plan something new then (``provisionerd.planner.deadlines``).
    wake: float = math.inf
    #: Machines that would retire for not joining, held until the hosts are confirmed (planner.rejoin).
    unconfirmed: int = 0
    #: The items whose ``active`` count this pass lowered below the view's (:meth:`lower`): with the view's short
    #: items (``FactView.balance``), every item that can have a deficit.
    lowered: set[str] = attrs.field(factory=set)

    def due(self, at: float, now: float) -> None:
        """Note a deadline at ``at``, if it is after ``now`` and before the earliest one noted."""
        if now < at < self.wake:
            self.wake = at

    def lower(self, demand_id: str, n: int = 1) -> None:
        """``n`` of ``demand_id``'s active machines are not supply this pass (retiring, in flight, draining)."""
        self.active[demand_id] -= n
        self.lowered.add(demand_id)

    def provider_load(self) -> dict[str, int]:
        """A copy of ``provider_loads`` (the allocator adds what it plans)."""
        return dict(self.provider_loads)


def _count_intents(
    tally: Tally, state: PlannerState, view: FactView, now: float, policy: Policy, in_flight: InFlight
) -> set[str]:
    """Outstanding machines of open intents and pending requests; returns the op_ids past their timeout."""
    load, outstanding, provider_loads = tally.load, tally.outstanding, tally.provider_loads
    timed_out: set[str] = set()
    seen_before, pending = state.intent_seen, in_flight.requests
    timeouts: dict[str, float] = {}  # provider -> its provisioning_timeout (one lookup per provider, not per op)
    for op_id in view.open_ops:
        record = view.intents[op_id]
        intent = record.intent
        missing = record.outstanding
        key = (intent.provider, intent.template_id)
        load[key] = load.get(key, 0) + missing
        provider_loads[intent.provider] = provider_loads.get(intent.provider, 0) + missing
        outstanding[intent.demand_id] = outstanding.get(intent.demand_id, 0) + missing
        seen = tally.intent_seen[op_id] = seen_before.get(op_id, now)  # planned_at carried over on commit
        timeout = timeouts.get(intent.provider)
        if timeout is None:
            timeout = timeouts[intent.provider] = policy.of(intent.provider).provisioning_timeout
        if now - seen >= timeout:
            timed_out.add(op_id)
            if op_id not in in_flight.fails:
                tally.fails.append(record)
        else:
            tally.due(seen + timeout, now)
    for request in pending.values():  # planned, intent not committed yet
        key = (request.provider, request.template_id)
        load[key] = load.get(key, 0) + request.count
        provider_loads[request.provider] = provider_loads.get(request.provider, 0) + request.count
        outstanding[request.demand_id] = outstanding.get(request.demand_id, 0) + request.count
    return timed_out


def tally(
    state: PlannerState,
    view: FactView,
    hosts: Mapping[str, HostState],
    now: float,
    policy: Policy,
    wanted: Mapping[str, int] | None,
    check: CapabilityCheck | None = None,
    rejoin: Rejoin = SETTLED,
    in_flight: InFlight = NOTHING_IN_FLIGHT,
    over: Collection[str] | None = None,
) -> Tally:
    """Count supply and find the machines to retire, in precedence order per machine:

    reclaimed (lost) > made by an all-or-nothing op that ended short (``all_or_nothing``,
    :mod:`provisionerd.planner.gang`; a busy one is not supply and waits to be idle) > not joined and its intent
    timed out (``provisioning_timeout``) > not joined past the join deadline (``never_joined``) > joined, not busy,
    and its host's capability report falls short of its template (``check`` says why: ``capability_mismatch``,
    :mod:`provisionerd.planner.health`) > joined and older than ``max_ttl`` (idle: ``max_ttl``; busy: drained, see
    :mod:`provisionerd.planner.drain`), each deadline the machine's (or intent's) own provider's
    (``policy.of(provider)``). Every other active machine counts as supply for its demand item. Joined idle
    machines are listed (``idle``) only for items whose supply exceeds ``wanted`` (demand_id -> count), the only
    ones that can give machines away (none when ``wanted`` is ``None``: demand unknown). ``over``: the items that
    may have more active machines than ``wanted`` (a superset: ``FactView.balance``'s, which the plan keeps between
    passes); ``None``: every item is checked.

    ``rejoin`` (:mod:`provisionerd.planner.rejoin`): until a provider's settle window after the last (re)join has
    passed, none of its machines is retired for not joining (timed-out intents, ``never_joined``) or for its
    capabilities; a machine that joined before is never ``never_joined`` (after the window: ``not_rejoined``).

    ``hosts`` is keyed by instance_ref. A host the controller calls LOST counts as supply and is never returned
    here (the orphan classifier's ghost rule owns it). ``in_flight``: what this process planned that the facts do
    not show yet (``InFlight.unseen``: its machines are all still active). Machines in flight (pending return or
    lost) count against the caps but not as supply.

    Cost: proportional to the machines not joined (past the shortest provider's join deadline), joined and not
    busy (only those of items with excess, unless some provider has a ``max_ttl``), in flight or reclaimed, when
    ``hosts`` is ``view.hosts`` (indexes kept as hosts and facts change, see
    :mod:`provisionerd.planner.host_table`); any other mapping costs one more C-level pass over every machine and a
    loop over every host to build the same index.
    """
    result = Tally(
        load=dict(view.live_by_offer), provider_loads=dict(view.live_by_provider), active=Supply(view.active_by_demand)
    )
    timed_out = _count_intents(result, state, view, now, policy, in_flight)
    active = result.active
    machines, active_refs, seen_before = view.machines, view.active_refs, state.machine_seen
    skip = set(in_flight.retiring)
    for machine_id in skip:  # InFlight.unseen kept only machines still ACTIVE
        result.lower(machines[machine_id].demand_id)
    for machine_id in state.reclaimed.keys() - skip:
        machine = machines.get(machine_id)
        if machine is not None and machine.state is MachineState.ACTIVE:
            result.lost.append(machine)
            result.lower(machine.demand_id)
            skip.add(machine_id)
    # An all-or-nothing op that ended short (planner.gang): its machines are not supply, returned unless busy.
    for machine, busy in gang.broken_members(view, hosts, skip):
        result.lower(machine.demand_id)
        skip.add(machine.machine_id)
        if not busy:
            result.retire.append((gang.ALL_OR_NOTHING, machine))

    def launched_at(machine: MachineRecord) -> float:
        if machine.launch_time > 0:
            return machine.launch_time
        launched = seen_before.get(machine.machine_id, now)  # unknown: count from first seen (never early)
        result.machine_seen[machine.machine_id] = launched
        return launched

    # Not joined: only the machines that may retire are read (see provisionerd.planner.host_table), in precedence order:
    # those of a timed-out intent, then those past the join deadline, then those whose launch time is unknown.
    joins = join_index(active_refs, hosts)
    window = Window(rejoin, joins.unjoined, now, lambda provider: policy.of(provider).rejoin_settle)

    def settling(machine: MachineRecord) -> bool:
        """Its provider's settle window is open: wake when it ends, retire nothing for not joining before."""
        if window.settled_for(machine):
            return False
        result.due(window.until(machine.provider), now)
        return True

    def unconfirmed(machine: MachineRecord) -> bool:
        """Settling, or "no host" not read from a confirmed host table yet (counted: the loop asks for one)."""
        if settling(machine):
            return True
        if not rejoin.hosts_confirmed:
            result.unconfirmed += 1
            return True
        return False

    for op_id in timed_out:
        for machine in joins.unjoined_of(op_id):
            if machine.machine_id not in skip and not window.joined_before(machine) and not unconfirmed(machine):
                result.retire.append(("provisioning_timeout", machine))
                result.lower(machine.demand_id)
    # The cutoff is the shortest deadline of any provider, with a second of slack so float rounding never hides a
    # machine; the test below, with the machine's own provider's deadline, decides.
    cutoff = now - policy.min_join_deadline + 1.0
    late = joins.unjoined_launched_by(cutoff)
    deadlines: dict[str, float] = {}
    for machine in (*late, *joins.unjoined_unknown_launch()):
        if machine.machine_id in skip or (machine.op_id in timed_out and not window.joined_before(machine)):
            continue
        deadline = deadlines.get(machine.provider)
        if deadline is None:
            deadline = deadlines[machine.provider] = policy.of(machine.provider).join_deadline
        launched = launched_at(machine)
        if now - launched >= deadline:
            if unconfirmed(machine):
                continue
            result.retire.append((window.reason(machine, launched), machine))
            result.lower(machine.demand_id)
        else:
            result.due(launched + deadline, now)
    # The machines not read above launched after the cutoff: the earliest of them is due no sooner than its launch
    # plus the shortest deadline (a lower bound: waking then reads it above, with its own provider's deadline).
    earliest = joins.earliest_unjoined_launch_after(cutoff)
    if earliest is not None:
        result.due(earliest + policy.min_join_deadline, now)

    if check is not None:  # a report that falls short of the template: not supply (planner.health)
        # Only hosts not known to pass are read (the kept index, HostTable.unjudged). Their order does not matter:
        # capability_mismatch returns are grouped and sorted by machine id (plan._emit), never budgeted.
        verdicts, judge = check.verdicts, check.judge
        for ref, (host, machine) in joins.unjudged(verdicts):
            judged = verdicts.get(ref)
            if judged is not None and judged[0] is host and not judged[1]:
                joins.judged(ref, host)
                continue  # this very host state passed before
            if machine.machine_id in skip:
                continue
            if not window.hosts_back(machine.provider):
                result.due(window.until(machine.provider), now)
                continue
            reasons = judge(host, machine)
            if reasons:
                after_join = host.probed_at > 0
                result.retire.append((UNHEALTHY_AFTER_JOIN if after_join else CAPABILITY_MISMATCH, machine))
                result.shortfalls[machine.machine_id] = reasons
                if after_join:
                    result.after_join.add(machine.machine_id)
                result.lower(machine.demand_id)
                skip.add(machine.machine_id)
            else:
                joins.judged(ref, host)
        # Health after join: a busy machine whose re-probe falls short is drained out of placement and replaced now
        # (not supply), then returned when idle (above, next passes) or at drain_timeout, busy or not.
        for _, (host, machine) in joins.reprobed_busy():
            if machine.machine_id in skip or not window.hosts_back(machine.provider):
                continue
            reasons = judge(host, machine)
            if not reasons:
                continue
            result.shortfalls[machine.machine_id] = reasons
            result.after_join.add(machine.machine_id)
            result.lower(machine.demand_id)
            skip.add(machine.machine_id)
            since = drain.drain_started(machine, state.drain_seen)
            if since is None:
                result.unhealthy_drain.append(machine)
                continue
            timeout_at = since + policy.of(machine.provider).drain_timeout
            if now >= timeout_at:
                result.retire.append((UNHEALTHY_AFTER_JOIN, machine))
            else:
                result.due(timeout_at, now)
    # A reclaim notice (planner.drain.noticed): not supply from now on, returned when idle or before the deadline.
    table = hosts.indexes(active_refs) if isinstance(hosts, HostTable) else None
    found_notices = drain.noticed(
        table.noticed() if table is not None else hosts.values(), active_refs, skip, state.drain_seen, now, policy
    )
    for machine in (*(m for _, m in found_notices.retire), *found_notices.drain, *found_notices.draining):
        result.lower(machine.demand_id)
        skip.add(machine.machine_id)
    result.retire.extend(found_notices.retire)
    result.notice_drain = found_notices.drain
    result.due(found_notices.wake, now)
    # Items that give machines away are fixed before max_ttl retirements (which only lower their supply). In
    # demand_id order: what the plan does with their idle machines must not depend on the order facts were folded in.
    givers: list[str] = []
    if wanted is not None:
        candidates = active if over is None else over
        givers = sorted(d for d in candidates if active.get(d, 0) > wanted.get(d, 0) and d in joins.available)
    idle = result.idle
    aged: set[str] = set()
    if policy.any_max_ttl:  # every joined machine may be past its provider's max_ttl (planner.drain), busy or not
        found = drain.aged(active_refs, hosts, skip, launched_at, state.drain_seen, now, policy)
        for reason_machine in found.retire:
            result.retire.append(reason_machine)
        for machine in (*(m for _, m in found.retire), *found.draining):
            result.lower(machine.demand_id)
            aged.add(machine.machine_id)
        result.drain = found.drain
        aged.update(m.machine_id for m in found.drain)  # busy: never idle-listed anyway
        result.due(found.wake, now)
    # Each giver's idle entries come sorted from the join index (kept between passes by HostTable); only the items
    # with a machine in ``skip`` or ``aged`` are filtered, found from those few machines' records.
    touched: set[str] = set()
    every = False  # a machine not in the view: filter every giver, as a stale record would need
    for machine_id in (*skip, *aged):
        machine = machines.get(machine_id)
        if machine is None:
            every = True
            break
        touched.add(machine.demand_id)
    for demand_id in givers:
        kept = joins.idle_entries(demand_id)
        if every or demand_id in touched:
            entries: Sequence[IdleEntry] = [e for e in kept if e[1] not in skip and e[1] not in aged]
        else:
            entries = kept  # read only (Tally.idle): no copy, no write to each entry's reference count
        if entries:
            idle[demand_id] = entries
            offer = joins.idle_offer(demand_id)
            if offer is not None:
                result.idle_offer[demand_id] = offer
    return result
