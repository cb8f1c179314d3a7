"""The disruption budget (issue 20, item 5): how many machines a provider may lose *by our choice* per interval.

Pure; part of :func:`provisionerd.planner.plan.plan`. Returns are of two kinds:

- **voluntary** (``VOLUNTARY``): the machine works and we decide it should go: ``idle`` (unneeded for
  ``idle_time``), ``max_ttl`` (old), ``released`` (its reservation completed, :mod:`provisionerd.planner.release`).
  These are capped per provider at ``disruption_budget`` machines and/or ``disruption_budget_percent`` percent of
  the provider's live machines (rounded up; the smaller binds when both are set) in any sliding
  ``disruption_interval`` seconds. The rest wait, noted ``deferred``, and the plan wakes when the window frees
  room. Release on completion is voluntary on purpose: a finished reservation of 1,000 machines is exactly the
  mass return a budget is there to pace (with no budget configured, the default, it still goes at once).
- **involuntary**: the machine is broken or never was one: ``never_joined``, ``not_rejoined``, ``no_host``,
  ``provisioning_timeout``, and machines marked lost. Holding them back would only keep paying for nothing, so
  the budget never counts or holds them.

The window is a log of ``(planned_at, provider, machines)`` kept in :class:`provisionerd.planner.state.PlannerState`
(like the step limit's): a return planned is counted whether or not it succeeds, so the budget only ever
over-counts. A restarted daemon reads it back from the facts before its first plan (:mod:`provisionerd.planner.
windows`; empty only against a controller that keeps no commit times, or when that read fails).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from provisionerd.planner.policy import Policy, ProviderPolicy

VOLUNTARY = frozenset({"idle", "max_ttl", "released"})

#: ``(planned_at, provider, machines)``: voluntary returns planned within the window.
DisruptionLog = tuple[tuple[float, str, int], ...]


def allowance(own: ProviderPolicy, live: int) -> int | None:
    """Voluntary returns a provider with ``live`` machines may have per interval (``None``: no budget)."""
    limits = []
    if own.disruption_budget is not None:
        limits.append(own.disruption_budget)
    if own.disruption_budget_percent is not None:
        limits.append(math.ceil(own.disruption_budget_percent * max(live, 0) / 100.0))
    return min(limits) if limits else None


def used(log: DisruptionLog, provider: str, now: float, interval: float) -> int:
    """Machines ``provider`` returned voluntarily in the window ending at ``now``."""
    return sum(n for at, p, n in log if p == provider and now - at < interval)


def room(log: DisruptionLog, provider: str, live: int, now: float, own: ProviderPolicy) -> int | None:
    """How many more voluntary returns ``provider`` may have now (``None``: unlimited)."""
    allowed = allowance(own, live)
    if allowed is None:
        return None
    return max(0, allowed - used(log, provider, now, own.disruption_interval))


def room_returns_at(log: DisruptionLog, provider: str, now: float, own: ProviderPolicy) -> float | None:
    """When the oldest entry of ``provider`` in the window leaves it (the next time room can grow)."""
    inside = [at for at, p, _ in log if p == provider and now - at < own.disruption_interval]
    return min(inside) + own.disruption_interval if inside else None


def recorded(log: DisruptionLog, spent: Mapping[str, int], now: float, policy: Policy) -> DisruptionLog:
    """``log`` without the entries past their provider's window, plus this plan's voluntary returns."""
    kept = tuple(e for e in log if now - e[0] < policy.of(e[1]).disruption_interval)
    return kept + tuple((now, provider, n) for provider, n in sorted(spent.items()) if n > 0)
