"""Hard max TTL with drain (issue 20, item 4): a machine past ``max_ttl`` goes back even when it never idles.

Pure; part of :func:`provisionerd.planner.plan.plan` (the pass in :func:`provisionerd.planner.supply.tally` calls
:func:`aged`). For each joined machine of a provider with a ``max_ttl``, once it is that old:

- idle (joined or idle, not draining): returned at once, reason ``max_ttl`` (voluntary: the disruption budget
  paces it, :mod:`provisionerd.planner.budget`);
- busy, not draining: asked to drain (``DrainMachines``: a ``DrainRequested`` fact, so the controller marks the
  host ``draining`` and places no new work on it). Asking is the voluntary disruption, so the budget paces the
  *request*; the machine stops counting as supply once it drains (a replacement is planned for its item);
- draining and idle: returned, reason ``drained`` (its budget was spent on the request: not counted again);
- draining and busy for ``drain_timeout`` since the drain was asked: returned anyway, reason ``drain_timeout``
  (never held by the budget: the drain already waited its turn).

When the drain started is read from the facts (``MachineRecord.drain_since``, the committed ``DrainRequested.at``)
or, until the fact lands, from the planner's memory (``PlannerState.drain_seen``, set when the drain is first
planned). Level-triggered: a lost snapshot changes nothing here (no demand is read); a restarted daemon reads the
drain from the facts, so it neither forgets it nor restarts its clock. A drain whose fact never landed (refused,
or a controller that does not know the fact) is kept in memory and not asked again by this process: the machine
is still returned at ``drain_timeout``; after a restart it is asked again and its clock starts over (later, never
earlier). A controller that ignores the drain keeps placing work: the machine still goes at ``drain_timeout``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Set

import attrs

from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner.fact_view import MachineRecord
from provisionerd.planner.host_table import HostTable
from provisionerd.planner.policy import Policy

#: ``DrainRequested.reason`` for a machine past its ``max_ttl``.
DRAIN_REASON = "max_ttl"
#: A machine with a reclaim notice: ``DrainRequested.reason`` of a busy one, and the return reason of one that is
#: not busy (or has drained); ``RECLAIM_DEADLINE``: returned busy, ``RECLAIM_MARGIN`` before the provider takes it.
RECLAIM = "reclaim"
RECLAIM_DEADLINE = "reclaim_deadline"
#: Seconds before ``HostState.reclaim_at`` at which a doomed machine still busy is returned anyway, so that the
#: return (a call, a poll) ends before the provider takes the machine (EC2 gives two minutes' notice).
RECLAIM_MARGIN = 30.0
#: Return reasons: a draining machine gone idle, and one still busy at its drain timeout.
DRAINED = "drained"
DRAIN_TIMEOUT = "drain_timeout"


@attrs.define
class Aged:
    """What :func:`aged` found (mutable working lists of one plan call)."""

    retire: list[tuple[str, MachineRecord]] = attrs.field(factory=list)  # (max_ttl | drained | drain_timeout, m)
    drain: list[MachineRecord] = attrs.field(factory=list)  # busy, past max_ttl, drain not asked yet
    draining: list[MachineRecord] = attrs.field(factory=list)  # busy and draining: not supply, not returned yet
    wake: float = math.inf

    def due(self, at: float, now: float) -> None:
        if now < at < self.wake:
            self.wake = at


def drain_started(machine: MachineRecord, drain_seen: Mapping[str, float]) -> float | None:
    """When ``machine``'s drain was asked: the committed fact's time, else this process's first ask; ``None``."""
    since = machine.drain_since
    if since > 0:
        return since
    return drain_seen.get(machine.machine_id)


def aged(
    active_refs: Mapping[str, MachineRecord],
    hosts: Mapping[str, HostState],
    skip: Set[str],
    launched_at: Callable[[MachineRecord], float],
    drain_seen: Mapping[str, float],
    now: float,
    policy: Policy,
) -> Aged:
    """Sort every joined, active machine past its provider's ``max_ttl`` into the rules above; note the next
    deadline (a ``max_ttl`` or a drain timeout). ``skip``: machines in flight (returning, lost). A host the
    controller calls LOST is left to the orphan classifier's ghost rule.

    Cost (only called when some provider has a ``max_ttl``): with ``hosts`` the view's own ``HostTable``, the
    machines launched before the shortest ``max_ttl`` (its launch-time heap) and those of unknown launch time;
    any other mapping, one pass over every active machine."""
    found = Aged()
    busy, lost = HostStatus.BUSY, HostStatus.LOST
    ttls: dict[str, float | None] = {}
    table = hosts.indexes(active_refs) if isinstance(hosts, HostTable) else None
    candidates: Iterable[MachineRecord] = active_refs.values()
    if table is not None:
        # A second of slack so float rounding never hides a machine; the test below, with its own provider's
        # max_ttl, decides. The machines not read are due no sooner than the earliest of them plus the shortest.
        cutoff = now - policy.min_max_ttl + 1.0
        candidates = (*table.active_launched_by(cutoff), *table.active_unknown_launch())
        earliest = table.earliest_active_launch_after(cutoff)
        if earliest is not None:
            found.due(earliest + policy.min_max_ttl, now)
    for machine in candidates:
        ref = machine.instance_ref
        host = hosts.get(ref)
        if host is None or host.status is lost or machine.machine_id in skip:
            continue
        provider = machine.provider
        if provider in ttls:
            max_ttl = ttls[provider]
        else:
            max_ttl = ttls[provider] = policy.of(provider).max_ttl
        if max_ttl is None:
            continue
        launched = launched_at(machine)
        if now - launched < max_ttl:
            found.due(launched + max_ttl, now)
            continue
        since = drain_started(machine, drain_seen)
        if host.status is not busy:
            found.retire.append((DRAINED if since is not None else "max_ttl", machine))
        elif since is None:
            found.drain.append(machine)
        elif now - since >= policy.of(provider).drain_timeout:
            found.retire.append((DRAIN_TIMEOUT, machine))
        else:
            found.draining.append(machine)
            found.due(since + policy.of(provider).drain_timeout, now)
    return found


@attrs.define
class Noticed:
    """What :func:`noticed` found (mutable working lists of one plan call). None of these machines is supply."""

    retire: list[tuple[str, MachineRecord]] = attrs.field(factory=list)  # (reclaim | reclaim_deadline | ..., m)
    drain: list[MachineRecord] = attrs.field(factory=list)  # busy, drain not asked yet
    draining: list[MachineRecord] = attrs.field(factory=list)  # busy and draining: returned later
    wake: float = math.inf

    def due(self, at: float, now: float) -> None:
        if now < at < self.wake:
            self.wake = at


def noticed(
    hosts: Iterable[HostState],
    active_refs: Mapping[str, MachineRecord],
    skip: Set[str],
    drain_seen: Mapping[str, float],
    now: float,
    policy: Policy,
) -> Noticed:
    """Sort the active machines whose host carries a reclaim notice (``HostState.noticed``: a spot interruption's
    ``reclaim_at``, a rebalance recommendation's ``rebalance_at``; protocol §6.4 "Reclaim notices"). Each stops
    counting as supply at once, so the same plan requests its replacement (retire before acquiring). Then:

    - not busy: returned at once, reason ``reclaim`` (involuntary: the disruption budget does not hold it);
    - busy, drain not asked: asked to drain (``DrainRequested`` reason ``reclaim``, not budgeted either);
    - busy at ``reclaim_at - RECLAIM_MARGIN``: returned anyway, reason ``reclaim_deadline``;
    - busy with only a rebalance recommendation, ``drain_timeout`` after its drain was asked: ``drain_timeout``;
    - otherwise draining, due at the earlier of those two times.

    ``hosts``: at least every host with a notice (others are passed over). ``skip``: machines in flight. A host
    the controller calls LOST is left to the orphan classifier's ghost rule."""
    found = Noticed()
    busy, lost = HostStatus.BUSY, HostStatus.LOST
    for host in hosts:
        if not host.noticed or host.status is lost:
            continue
        machine = active_refs.get(host.instance_ref)
        if machine is None or machine.machine_id in skip:
            continue
        if host.status is not busy:
            found.retire.append((RECLAIM, machine))
            continue
        deadline = host.reclaim_at - RECLAIM_MARGIN if host.reclaim_at > 0 else math.inf
        if now >= deadline:
            found.retire.append((RECLAIM_DEADLINE, machine))
            continue
        since = drain_started(machine, drain_seen)
        if since is None:
            found.drain.append(machine)
            found.due(deadline, now)
            continue
        if host.reclaim_at <= 0:
            timeout_at = since + policy.of(machine.provider).drain_timeout
            if now >= timeout_at:
                found.retire.append((DRAIN_TIMEOUT, machine))
                continue
            found.due(timeout_at, now)
        found.draining.append(machine)
        found.due(deadline, now)
    return found
