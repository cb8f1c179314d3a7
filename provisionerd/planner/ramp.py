"""Adaptive scale-up: each provider's step (the most machines asked of it in any sliding ``Policy.step_interval``)
grows while the provider keeps accepting requests and shrinks when it runs out of capacity or throttles.

Pure. One :class:`Ramp` per provider with its own ``ProviderPolicy.step_limit`` (the *floor*) lives in
``PlannerState.ramps``; a provider without one is not ramped (only the global ``Policy.step_limit`` binds it).

Rules
- The step starts at the floor (``step_limit``) and never leaves ``[floor, max(floor, cap)]``, ``cap`` being the
  provider's ``max_machines`` (``UNCAPPED`` when it has none). Both bounds are applied at every read
  (:func:`current`), so a reload that moves them applies at once.
- **Doubling, once per round trip**: when a request planned under the current step is accepted
  (:class:`Accepted`) and the plans under that step used all of it (:class:`Planned` with ``used_all``: the step was
  what held demand back), the step doubles. Only a request asked under the current step proves it: acceptances of
  older requests (asked under a smaller step) change nothing, so a burst of concurrent acceptances doubles once.
  The pace is the provider's answer time, not ``step_interval``: a demand jump of 1,000 from a step of 10 is asked
  for in 7 round trips (10, 20, 40 ... 640, then the cap), where a fixed step of 10 per 60 s took 100 minutes.
- **Halving**: ``capacity_unavailable`` or ``throttled`` from the provider (:class:`Refused`) halves the step, not
  below the floor. Refusals of calls made before the last halving (no request asked since) do not halve again, so
  a burst of refusals from one round halves once.
- A step that grew is not kept small by a demand that is small: it stays where it is until a refusal halves it.

``asked`` is bounded (``MAX_ASKED`` op_ids): a round that plans more requests than that may miss its doubling,
never gain one.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

#: The cap of a provider without ``max_machines``: the step stays a bounded integer.
UNCAPPED = 1 << 20
#: Most request op_ids remembered per step (the requests of one round; each plan asks one per offer).
MAX_ASKED = 64
#: Why a step last changed: ``start`` (the floor), ``accepted`` (doubled), or the refusal that halved it.
HALVING = frozenset({"capacity_unavailable", "throttled"})


@attrs.frozen
class Ramp:
    """One provider's step: ``step`` (before clamping, see :func:`current`), why it last changed, the requests
    planned under it (``asked``) and whether those plans used all of it (``saturated``)."""

    step: int
    reason: str = "start"
    asked: tuple[str, ...] = ()
    saturated: bool = False


@attrs.frozen
class Planned:
    """A plan asked ``provider`` for the requests ``op_ids`` (maybe none) and, with ``used_all``, left no room in its
    step (demand wanted at least the whole step)."""

    op_ids: tuple[str, ...]
    used_all: bool


@attrs.frozen
class Accepted:
    """``requestMachines`` for ``op_id`` was accepted by the provider."""

    op_id: str


@attrs.frozen
class Refused:
    """The provider answered ``reason`` (``capacity_unavailable`` or ``throttled``)."""

    reason: str

    def __attrs_post_init__(self) -> None:
        if self.reason not in HALVING:
            raise ValueError(f"reason must be one of {sorted(HALVING)}, not {self.reason!r}")


Outcome = Planned | Accepted | Refused


def bounds(floor: int, cap: int | None) -> tuple[int, int]:
    """The step's range for a provider with step limit ``floor`` and ``max_machines`` ``cap``."""
    return floor, max(floor, UNCAPPED if cap is None else cap)


def current(ramp: Ramp | None, floor: int, cap: int | None) -> int:
    """The step in force: ``ramp``'s, clamped to :func:`bounds` (the floor when there is no ramp yet)."""
    low, high = bounds(floor, cap)
    return low if ramp is None else min(max(ramp.step, low), high)


def advance(ramp: Ramp | None, outcome: Outcome, floor: int, cap: int | None) -> Ramp:
    """The ramp after ``outcome`` (see the module docstring). Returns ``ramp`` itself when nothing changes."""
    step = current(ramp, floor, cap)
    low, high = bounds(floor, cap)
    was = ramp if ramp is not None else Ramp(step)
    match outcome:
        case Planned():
            if step >= high:  # at the cap: nothing to prove
                return was
            asked = (*was.asked, *outcome.op_ids)[-MAX_ASKED:]
            saturated = was.saturated or outcome.used_all
            if asked == was.asked and saturated == was.saturated:
                return was
            return attrs.evolve(was, step=step, asked=asked, saturated=saturated)
        case Accepted():
            if not was.saturated or outcome.op_id not in was.asked or step >= high:
                return was
            return Ramp(min(high, step * 2), "accepted")
        case Refused():
            if was.reason in HALVING and not was.asked:
                return was  # a refusal of a call made before the last halving: the same round
            return Ramp(max(low, step // 2), outcome.reason)
    raise TypeError(f"not a ramp outcome: {outcome!r}")


def changes(
    old: Mapping[str, Ramp], new: Mapping[str, Ramp], limits: Mapping[str, tuple[int, int | None]]
) -> list[tuple[str, int, int, str]]:
    """``(provider, old_step, new_step, reason)`` for every provider in ``limits`` (``(floor, cap)``) whose step in
    force differs between ``old`` and ``new``. Cheap: a ramp left unchanged is the same object."""
    found = []
    for provider, ramp in new.items():
        before = old.get(provider)
        if ramp is before or provider not in limits:
            continue
        floor, cap = limits[provider]
        was, now = current(before, floor, cap), current(ramp, floor, cap)
        if was != now:
            found.append((provider, was, now, ramp.reason))
    return found
