"""The next planned action on one machine and when: what ``provisionerd machines`` shows (issue 32, item 1).

Pure; no trio, no I/O. It reads the same rules :func:`provisionerd.planner.plan.plan` acts on, per machine and in
the same precedence (:func:`provisionerd.planner.supply.tally`), for a machine the plan does not retire *now*:

- in flight (a return committed or planned, reclaimed and marked lost): ``returning`` / ``lost``, no time;
- not joined: returned at ``launch + join_deadline`` (reason ``never_joined``, or the settle window's
  ``not_rejoined`` / ``no_host``; ``launch`` is the launch time, or when the planner first saw the machine when the
  provider gave none: ``PlannerState.machine_seen``); a settle window after a (re)join to the controller holds it
  until the window ends (:mod:`provisionerd.planner.rejoin`); a machine of an intent still open is returned at
  the intent's ``provisioning_timeout`` when that comes first (``provisioning_timeout``);
- joined, its provider has a ``max_ttl``: at ``launch + max_ttl`` an idle machine is returned (``max_ttl``) and a
  busy one asked to drain; once draining, returned at ``drain since + drain_timeout`` (:mod:`planner.drain`);
- joined and not busy, in its demand item's surplus (``surplus``: the item has more machines than it wants and this
  one is among the longest idle of them, :func:`provisionerd.planner.allocate.excess_pool`): returned at
  ``idle since + idle_time`` (reason ``idle``), unless another item reuses it first;
- otherwise nothing is planned (``kept``: its item needs it, or it is busy).

What is shown holds while the inputs hold: a machine retired for another reason (a join deadline, a ``max_ttl``)
before or at an idle machine's time lowers its item's supply, and the idle machine may then be kept; a new
snapshot changes the surplus. Times are the planner's wall seconds. The plan acts at the first plan at or after
the time (the loop wakes at the plan's ``wake_at`` plus ``PLAN_SLACK``); the disruption budget may still pace a
voluntary return after it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Set

import attrs

from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner import drain
from provisionerd.planner.drain import DRAIN_REASON, DRAIN_TIMEOUT, drain_started
from provisionerd.planner.fact_view import MachineRecord, MachineState
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.rejoin import Window

#: ``Outlook.action`` values.
RETURN, DRAIN, RETURNING, LOST, KEPT = "return", "drain", "returning", "lost", "kept"
#: Entries sorted per C call by ``surplus_ranks`` (about a millisecond each).
CHUNK = 4096


@attrs.frozen
class Outlook:
    """The next planned action on a machine: ``action`` (``return``, ``drain``, ``returning``, ``lost``,
    ``kept``), ``at`` (wall seconds; ``None``: no time, e.g. kept or already in flight), ``reason`` (the plan's
    return or drain reason, or why nothing is planned) and ``rule`` (the setting behind the time, e.g.
    ``idle_time 600 s``)."""

    action: str
    at: float | None
    reason: str
    rule: str = ""


def _seconds(value: float) -> str:
    return f"{value:g} s"


def launched_at(machine: MachineRecord, machine_seen: Mapping[str, float], now: float) -> float:
    """The launch time the planner's deadlines count from: the provider's, else when the planner first saw the
    machine (``PlannerState.machine_seen``), else ``now`` (it would start counting now: never early)."""
    if machine.launch_time > 0:
        return machine.launch_time
    return machine_seen.get(machine.machine_id, now)


def outlook(
    machine: MachineRecord,
    host: HostState | None,
    policy: ProviderPolicy,
    now: float,
    *,
    machine_seen: Mapping[str, float],
    drain_seen: Mapping[str, float],
    surplus: bool,
    in_flight: str = "",
    window: Window | None = None,
    intent_seen: float | None = None,
) -> Outlook:
    """See the module docstring. ``in_flight``: ``"return"`` or ``"lost"`` when the planner's state holds such an
    action under way for the machine (``InFlight.returns`` / ``lost``, the op book's). ``window``: the settle window
    after the last (re)join to the controller (:class:`provisionerd.planner.rejoin.Window`, as the plan builds it;
    ``None``: settled): a machine without a host is not retired before it ends, and its reason is the window's
    (``never_joined``, ``not_rejoined`` for one that joined before, ``no_host`` for one whose life was not seen).
    ``intent_seen``: when the planner first saw the machine's intent, if that intent is still open
    (``PlannerState.intent_seen``): past its ``provisioning_timeout`` the machine goes, if not joined, unless it
    had joined before."""
    if machine.state is MachineState.LOST or in_flight == "lost":
        return Outlook(LOST, None, "reclaimed by the provider")
    if machine.state is not MachineState.ACTIVE or machine.return_op or in_flight == "return":
        return Outlook(RETURNING, None, "return in flight")
    launched = launched_at(machine, machine_seen, now)
    if host is None:
        at = launched + policy.join_deadline
        reason = "never_joined" if window is None else window.reason(machine, launched)
        rule = f"join_deadline {_seconds(policy.join_deadline)}"
        joined_before = window is not None and window.joined_before(machine)
        if intent_seen is not None and not joined_before and intent_seen + policy.provisioning_timeout < at:
            # Its intent is still open and times out first: its machines not joined go then (planner.supply).
            at, reason = intent_seen + policy.provisioning_timeout, "provisioning_timeout"
            rule = f"provisioning_timeout {_seconds(policy.provisioning_timeout)}"
        if window is not None and not window.settled_for(machine) and window.until(machine.provider) > at:
            settle = window.until(machine.provider) - window.rejoin.since
            return Outlook(RETURN, window.until(machine.provider), reason, f"rejoin_settle {_seconds(settle)}")
        return Outlook(RETURN, at, reason, rule)
    if host.status is HostStatus.LOST:
        return Outlook(KEPT, None, "host lost: left to the orphan classifier")
    busy = host.status is HostStatus.BUSY
    ttl: Outlook | None = None
    if policy.max_ttl is not None:
        ttl_at = launched + policy.max_ttl
        since = drain_started(machine, drain_seen)
        if busy and since is not None and now >= ttl_at:
            at = since + policy.drain_timeout
            ttl = Outlook(RETURN, at, DRAIN_TIMEOUT, f"drain_timeout {_seconds(policy.drain_timeout)}")
        elif busy:
            ttl = Outlook(DRAIN, ttl_at, DRAIN_REASON, f"max_ttl {_seconds(policy.max_ttl)}")
        else:
            ttl = Outlook(
                RETURN, ttl_at, "drained" if since is not None else DRAIN_REASON, f"max_ttl {_seconds(policy.max_ttl)}"
            )
    idle: Outlook | None = None
    if not busy and surplus:
        idle = Outlook(RETURN, host.since + policy.idle_time, "idle", f"idle_time {_seconds(policy.idle_time)}")
    found = [o for o in (ttl, idle) if o is not None and o.at is not None and math.isfinite(o.at)]
    if found:
        return min(found, key=lambda o: o.at if o.at is not None else math.inf)
    return Outlook(KEPT, None, "busy" if busy else "its demand item needs it")


def surplus_ranks(entries: list[tuple[int, float, str]], excess: int) -> set[str]:
    """The machine ids the plan would give away from one demand item: of its joined, not busy machines (each
    ``Policy.surplus_key``: ``(-priority, idle since, machine_id)``), the ``excess`` first: the highest priority
    number, then the longest idle, ties by machine id (``allocate.excess_pool``).

    Sorted in chunks of ``CHUNK`` merged lazily, so that run in a worker thread it never holds the interpreter
    for more than one chunk's sort (one C call each) and the event loop keeps turning."""
    if excess <= 0:
        return set()
    if excess >= len(entries):
        return {entry[-1] for entry in entries}
    chunks = [sorted(entries[i : i + CHUNK]) for i in range(0, len(entries), CHUNK)]
    return {entry[-1] for entry in itertools.islice(heapq.merge(*chunks), excess)}


def item_surplus(
    available: Iterable[tuple[HostState, MachineRecord]],
    drained: Iterable[MachineRecord],
    hosts: Mapping[str, HostState],
    *,
    active: int,
    wanted: int,
    skip: Set[str],
    machine_seen: Mapping[str, float],
    drain_seen: Mapping[str, float],
    now: float,
    policy: Policy,
) -> set[str]:
    """The machines of one demand item the plan gives away once idle for ``idle_time``: as
    :func:`provisionerd.planner.supply.tally` then ``allocate.excess_pool``. ``available``: the item's joined, not
    busy, active machines with their hosts (the join index's group); ``drained``: its active machines asked to drain;
    ``active``: its active machines less those in ``skip`` (in flight). Machines past their provider's ``max_ttl``
    (:func:`provisionerd.planner.drain.aged` over these machines, the planner's own rule) are not supply when returned
    or draining, and never given away as idle."""
    group = [(host, machine) for host, machine in available if machine.machine_id not in skip]
    if policy.any_max_ttl:
        candidates = {m.instance_ref: m for _, m in group}
        candidates.update((m.instance_ref, m) for m in drained if m.machine_id not in skip)
        found = drain.aged(
            candidates, hosts, skip, lambda m: launched_at(m, machine_seen, now), drain_seen, now, policy
        )
        out = {m.machine_id for _, m in found.retire} | {m.machine_id for m in found.draining}
        past = out | {m.machine_id for m in found.drain}
        active -= len(out)
        group = [(host, machine) for host, machine in group if machine.machine_id not in past]
    key = policy.surplus_key
    return surplus_ranks(
        [key(machine.provider, host.since, machine.machine_id, machine.template_id) for host, machine in group],
        active - wanted,
    )
