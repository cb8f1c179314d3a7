"""The pass-wide preconditions: who may act now, the circuit breaker, the rate cap and dry run.

Pure. Every precondition that blocks a finding's action is named in its ``blocked_by``, so the admin report
explains each one; a finding is allowed only with an empty list. Which preconditions apply depends on the action:

==================  ======================================================================================
blocker             applies to
==================  ======================================================================================
listing_unreadable  every action (the whole pass acts on nothing)
listing_absent      every action: the provider cannot list at all (legacy LSF), so nothing that rests on a
                    listing may happen; only the facts' findings are reported
view_unreadable     every action (the whole pass acts on nothing)
no_lease            every action: each one commits a fact stamped with the lease epoch
not_primary         every action
settling            every action: before workers had their chance to rejoin, "no host" proves nothing
protected           return, stop, terminate, adopt (a report touches nothing, so protected machines are still
                    reported)
breaker_open        return, stop, terminate, retire, adopt
rate_cap            return, stop, terminate, retire, counted in finding order over the findings that nothing
                    else (except dry run) blocks, so the dry-run report shows which ones the cap would defer
dry_run             every action
==================  ======================================================================================

The action ``none`` (nothing left to do) is never blocked.
"""

from __future__ import annotations

from collections.abc import Sequence

from provisionerd.orphans.detect import Candidate
from provisionerd.orphans.model import (
    ALREADY_REPORTED,
    BREAKER_ACTIONS,
    BREAKER_OPEN,
    CLEANUP_ACTIONS,
    DRY_RUN,
    GHOST,
    LISTING_ABSENT,
    LISTING_UNREADABLE,
    NEVER_JOINED,
    NO_LEASE,
    NOT_PRIMARY,
    PROTECTED,
    PROTECTED_ACTIONS,
    RATE_CAP,
    SETTLING,
    TAGGED_UNKNOWN,
    VIEW_UNREADABLE,
    BreakerState,
    ClassifierMemory,
    ListingAbsent,
    Observation,
    Unreadable,
    ordered_blockers,
)
from provisionerd.orphans.policy import OrphanPolicy

#: The classes whose findings count as "machines looking orphaned" for the breaker's share trip.
SHARE_CLASSES = frozenset({NEVER_JOINED, TAGGED_UNKNOWN, GHOST})


def pass_blockers(obs: Observation) -> tuple[str, ...]:
    """The blockers that hold for every action this pass, whatever the finding."""
    blockers = []
    if isinstance(obs.listing, ListingAbsent):
        blockers.append(LISTING_ABSENT)
    elif isinstance(obs.listing, Unreadable):
        blockers.append(LISTING_UNREADABLE)
    if isinstance(obs.view, Unreadable):
        blockers.append(VIEW_UNREADABLE)
    if not obs.lease.usable:
        blockers.append(NO_LEASE)
    if not obs.controller.primary:
        blockers.append(NOT_PRIMARY)
    if not obs.controller.settled:
        blockers.append(SETTLING)
    return tuple(blockers)


def breaker_state(
    candidates: Sequence[Candidate], known_machines: int, policy: OrphanPolicy, memory: ClassifierMemory
) -> BreakerState:
    """Open after ``breaker_max_failures`` consecutive failed cleanups, or for a pass in which more than
    ``breaker_min_orphans`` machines and more than ``breaker_max_share`` of the known ones look orphaned.

    A machine already reported (an ``OrphanReported`` fact of its class) is explained by that fact: it is no longer
    a suspect. Otherwise the machines a store loss left without facts would hold the breaker open for good once
    reported, and with it every later retirement (a ghost that vanished would count as supply forever)."""
    suspects = sum(1 for c in candidates if c.orphan_class in SHARE_CLASSES and ALREADY_REPORTED not in c.blockers)
    reasons = []
    if memory.failed_cleanups >= policy.breaker_max_failures:
        reasons.append("failed_cleanups")
    too_many = suspects > policy.breaker_min_orphans
    if known_machines and too_many and suspects > policy.breaker_max_share * known_machines:
        reasons.append("orphan_share")
    return BreakerState(bool(reasons), tuple(reasons), suspects, known_machines)


def gate(
    candidates: Sequence[Candidate],
    obs: Observation,
    policy: OrphanPolicy,
    breaker: BreakerState,
) -> list[tuple[str, ...]]:
    """The full ``blocked_by`` of each candidate, in order."""
    common = pass_blockers(obs)
    result: list[tuple[str, ...]] = []
    cleanups = 0
    for candidate in candidates:
        action = candidate.action
        if action == "none":
            result.append(())
            continue
        blockers = list(common) + list(candidate.blockers)
        if candidate.protected and action in PROTECTED_ACTIONS:
            blockers.append(PROTECTED)
        if breaker.open and action in BREAKER_ACTIONS:
            blockers.append(BREAKER_OPEN)
        if action in CLEANUP_ACTIONS and not blockers:
            cleanups += 1
            if cleanups > policy.max_cleanup_per_interval:
                blockers.append(RATE_CAP)
        if policy.dry_run:
            blockers.append(DRY_RUN)
        result.append(ordered_blockers(blockers))
    return result
