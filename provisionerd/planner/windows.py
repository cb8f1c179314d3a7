"""The health windows a restarted daemon picks up from the facts (issue 35 item 2: "the windows survive a daemon
restart, rebuilt from the facts").

Pure; no trio, no I/O. Two windows live in :class:`provisionerd.planner.state.PlannerState` and were lost with the
process: the ``max_unhealthy`` log (:mod:`provisionerd.planner.health`: unhealthy findings within each provider's
``max_unhealthy_window``) and the disruption budget's log (:mod:`provisionerd.planner.budget`: voluntary returns
within each provider's ``disruption_interval``). So a daemon restarted while a bad image kept breaking machines
replaced them all again, and one restarted in the middle of a budgeted drain-down returned a second budget at once.

Both are read back from what the daemon itself committed, at the time the controller committed it
(``CommittedFact.committed_at``; a fact without one, from an older controller, is skipped: the window then
under-counts, as before this existed):

- an unhealthy finding is a ``ReturnIntent`` whose reason is one of ``health.UNHEALTHY_REASONS`` (the reason
  without its detail, ``capability_mismatch: ngpus 0 < 1`` counts), one entry per machine, or a ``Lost`` (a
  machine the provider reclaimed: the planner's ``MarkLost``);
- a voluntary return is a ``ReturnIntent`` whose reason is in ``budget.VOLUNTARY``, one entry per intent with its
  machine count;
- a machine drained because a re-probe after its join fell short (``DrainRequested`` reason
  ``unhealthy_after_join``) is an unhealthy finding from its drain on.

The planner writes each entry at the plan that decided it, the intent is committed a moment later: the rebuilt
window is at most that moment younger than the lost one, so it holds an entry a little longer, never shorter. An
entry already out of its provider's window at ``now`` is dropped; the logs' own bounds (``health.MAX_LOGGED``) and
their merge with what the running planner logged since (``merged``) keep them as the planner keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from provisionerd.domain.model import CommittedFact, DrainRequested, Lost, ReturnIntent
from provisionerd.planner import budget, health
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import PlannerState


@attrs.frozen
class Windows:
    """``unhealthy``: ``health.UnhealthyLog``; ``disruptions``: ``budget.DisruptionLog``; both oldest first."""

    unhealthy: health.UnhealthyLog = ()
    disruptions: budget.DisruptionLog = ()


def span(policy: Policy, providers: Iterable[str]) -> float:
    """How far back the facts must be read for ``providers``' windows (seconds; 0: none of them has one): the
    ``max_unhealthy_window`` of those with a ``max_unhealthy`` limit, the ``disruption_interval`` of those with a
    disruption budget. A provider with neither keeps nothing, so nothing is read for it."""
    longest = 0.0
    for provider in providers:
        own = policy.of(provider)
        if own.max_unhealthy is not None or own.max_unhealthy_percent is not None:
            longest = max(longest, own.max_unhealthy_window)
        if own.disruption_budget is not None or own.disruption_budget_percent is not None:
            longest = max(longest, own.disruption_interval)
    return longest


def rebuilt(facts: Iterable[CommittedFact], now: float, policy: Policy, before: float | None = None) -> Windows:
    """The windows the facts imply at wall time ``now`` (see the module docstring). ``before``: only facts committed
    before then count (this process's own plans since are in its state already: counted twice otherwise)."""
    until = now if before is None else min(now, before)
    findings: list[tuple[float, str, str]] = []
    disruptions: list[tuple[float, str, int]] = []
    for committed in facts:
        at = committed.committed_at
        if not at > 0 or at >= until:  # no time (an older controller), or this process's own: nothing to place
            continue
        fact = committed.fact
        own = policy.of(fact.provider)
        if isinstance(fact, ReturnIntent):
            kind = health.reason_kind(fact.reason)
            if kind in health.UNHEALTHY_REASONS and at + own.max_unhealthy_window > now:
                findings.extend((at, fact.provider, machine_id) for machine_id in fact.machine_ids)
            elif kind in budget.VOLUNTARY and now - at < own.disruption_interval and fact.machine_ids:
                disruptions.append((at, fact.provider, len(fact.machine_ids)))
        elif isinstance(fact, Lost) and at + own.max_unhealthy_window > now:
            findings.append((at, fact.provider, fact.machine_id))
        elif isinstance(fact, DrainRequested) and health.reason_kind(fact.reason) in health.UNHEALTHY_REASONS:
            if at + own.max_unhealthy_window > now:  # unhealthy after its join: found at the drain
                findings.extend((at, fact.provider, machine_id) for machine_id in fact.machine_ids)
    findings.sort()
    disruptions.sort()
    return Windows(_bounded(findings), tuple(disruptions))


def _bounded(findings: list[tuple[float, str, str]]) -> health.UnhealthyLog:
    """One entry per machine (its first), at most ``health.MAX_LOGGED`` per provider, as ``health.recorded``."""
    seen: set[str] = set()
    per_provider: dict[str, int] = {}
    kept = []
    for at, provider, machine_id in findings:
        if machine_id in seen or per_provider.get(provider, 0) >= health.MAX_LOGGED:
            continue
        seen.add(machine_id)
        per_provider[provider] = per_provider.get(provider, 0) + 1
        kept.append((at, provider, machine_id))
    return tuple(kept)


def merged(state: PlannerState, windows: Windows) -> PlannerState:
    """``state`` with ``windows`` under what it logged itself (``rebuilt(..., before=...)`` left out what it logged;
    a machine in both is kept once, at its own entry)."""
    mine = {entry[2] for entry in state.unhealthy}
    unhealthy = tuple(sorted((*(e for e in windows.unhealthy if e[2] not in mine), *state.unhealthy)))
    disruptions = tuple(sorted((*windows.disruptions, *state.disruptions)))
    return attrs.evolve(state, unhealthy=unhealthy, disruptions=disruptions)
