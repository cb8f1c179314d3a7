"""The planner's own small memory, and the observations (besides snapshots and facts) that change it.

Pure. The facts (:class:`provisionerd.planner.fact_view.FactView`) remain the durable truth; this state only
remembers what the facts cannot say yet or at all:

- the highest snapshot seq applied (older snapshots are ignored);
- when each open intent was planned or first seen, and when a machine with an unknown launch time was first seen
  (the provisioning timeout and the join deadline count from there);
- provider back-off and health (:mod:`provisionerd.planner.capacity`), reclaim notices, and the step-limit window
  (per provider: each entry names the provider it asked);
- the op counter behind fresh op_ids.

After a restart a fresh state is safe: nothing was committed that the facts do not show, and every deadline
counted from "first seen" only starts later, never earlier. What it planned and the facts do not show yet is not
kept here: the op book keeps each op, and each plan reads it (:mod:`provisionerd.planner.in_flight`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from provisionerd.domain.actions import Note
from provisionerd.planner.capacity import (
    CallSucceeded,
    CapacityObservation,
    CapacityState,
    CapacityUnavailable,
    ProbeStarted,
    ProbeSucceeded,
    ProviderResumed,
    ProviderUnhealthy,
    Throttled,
    apply_capacity,
)
from provisionerd.planner.in_flight import PendingRequest
from provisionerd.planner.policy import Policy
from provisionerd.planner.ramp import Accepted, Outcome, Ramp, Refused, advance, current


@attrs.frozen
class ReclaimNotice:
    provider: str
    at: float


#: Gate refusals that say the controller cannot take an intent *for now* (it has no quorum, it is a standby, the
#: link broke): the loop plans nothing until ``PlannerState.intent_backoff`` ends, instead of replanning the same
#: work at once under a fresh op_id (found by the simulation: thousands of op_ids at one virtual instant).
BACKOFF_CODES = frozenset({"no_quorum", "not_primary", "LinkDown", "storage_failure"})
#: The back-off after consecutive refusals doubles from ``INTENT_BACKOFF_BASE`` up to ``INTENT_BACKOFF_MAX``
#: seconds; a refusal more than ``INTENT_BACKOFF_MAX`` after the last window ended starts over.
INTENT_BACKOFF_BASE = 1.0
INTENT_BACKOFF_MAX = 30.0
#: A lower ceiling for reasons that end without a word from the controller: a full disk freed by an operator is
#: not announced, so the daemon must try again soon enough to meet demand within one replan interval (10 s by
#: default) of the disk being freed. Each try is one refused commit: cheap for the controller.
INTENT_BACKOFF_MAX_BY_REASON = {"storage_failure": 4.0}


@attrs.frozen
class IntentBackoff:
    """Refusals in a row (``attempts``) and the end of the current window (wall seconds, like every planner time)."""

    attempts: int = 0
    until: float = -math.inf


@attrs.frozen
class PlannerState:
    """Frozen; :func:`provisionerd.planner.plan.plan` and :func:`observe` return new values.

    ``incarnation`` goes into every op_id; the driver sets it once per process start to something that differs
    between starts (e.g. the start time or random hex), so a restarted daemon never reuses an op_id that an
    earlier process may have committed as a ``Lost`` fact (request and return op_ids are also checked against the
    facts). ``jitter_seed`` is in ``capacity``.
    """

    incarnation: str = "0"
    applied_seq: int = -1
    next_op: int = 0
    intent_seen: Mapping[str, float] = attrs.field(factory=dict)  # open intent op_id -> planned / first seen
    machine_seen: Mapping[str, float] = attrs.field(factory=dict)  # machine_id (launch unknown) -> first seen
    reclaimed: Mapping[str, ReclaimNotice] = attrs.field(factory=dict)  # machine_id -> notice
    step_log: tuple[tuple[float, str, int], ...] = ()  # (planned_at, provider, machines), within the step window
    capacity: CapacityState = attrs.field(factory=CapacityState)
    intent_backoff: IntentBackoff = attrs.field(factory=IntentBackoff)
    ramps: Mapping[str, Ramp] = attrs.field(factory=dict)  # provider -> its adaptive step (planner.ramp)
    #: Voluntary returns within each provider's disruption window (``planner.budget``).
    disruptions: tuple[tuple[float, str, int], ...] = ()
    #: machine_id -> when this process first asked it to drain (``planner.drain``; until the fact shows it, and
    #: the only record when the fact never lands). Kept while the machine is active.
    drain_seen: Mapping[str, float] = attrs.field(factory=dict)
    #: Unhealthy machines found within each provider's ``max_unhealthy_window`` (``planner.health``).
    unhealthy: tuple[tuple[float, str, str], ...] = ()

    def intents_refused_until(self, now: float) -> float | None:
        """When the controller's last refusal window ends (``None`` when it has ended): plan nothing before."""
        until = self.intent_backoff.until
        return until if now < until else None

    @classmethod
    def initial(cls, incarnation: str = "0", jitter_seed: int = 0) -> PlannerState:
        if not incarnation or any(c in incarnation for c in ":/ "):
            raise ValueError(f"incarnation must be non-empty without ':', '/' or spaces, not {incarnation!r}")
        return cls(incarnation=incarnation, capacity=CapacityState(jitter_seed=jitter_seed))


# --- observations that are not capacity errors -----------------------------------------------------------------


@attrs.frozen
class ActionDropped:
    """The gate refused or never committed the action with ``op_id`` (for ``FailRequest``: the intent's op_id).

    Its op record marks it dropped, so it is no longer in flight and the next plan may plan it again
    (:mod:`provisionerd.planner.in_flight`). ``request`` (a request this process planned) with ``unacknowledged``:
    the controller answered that it did not take the intent (a typed rejection: ``storage_failure``,
    ``no_quorum``...), so no machine was asked for: its machines leave the step window (``PlannerState.step_log``)
    too. A drop whose intent may have been committed (a broken link) keeps them: the window only ever over-counts.
    """

    op_id: str
    unacknowledged: bool = False
    request: PendingRequest | None = None


@attrs.frozen
class Reclaimed:
    """``getReturnRequests`` says the provider takes these machines back: they will be retired as lost."""

    provider: str
    machine_ids: tuple[str, ...]
    at: float


@attrs.frozen
class IntentRefused:
    """The gate could not commit an intent for ``provider`` at ``at`` (wall) for a reason in ``BACKOFF_CODES``."""

    provider: str
    reason: str
    at: float


@attrs.frozen
class SnapshotSeqReset:
    """A resync after a controller failover may restart snapshot numbering: accept the next snapshot's seq."""


Observation = CapacityObservation | ActionDropped | Reclaimed | SnapshotSeqReset | IntentRefused


@attrs.frozen
class Observed:
    state: PlannerState
    notes: tuple[Note, ...] = ()


def observe(state: PlannerState, obs: Observation, policy: Policy) -> Observed:
    """Fold one observation into the planner's state."""
    match obs:
        case (
            CapacityUnavailable()
            | Throttled()
            | ProviderUnhealthy()
            | ProbeStarted()
            | ProbeSucceeded()
            | CallSucceeded()
            | ProviderResumed()
        ):
            capacity, notes = apply_capacity(state.capacity, obs, policy)
            ramps = _ramped(state.ramps, obs, policy)
            return Observed(attrs.evolve(state, capacity=capacity, ramps=ramps), notes)
        case ActionDropped():
            if obs.unacknowledged and obs.request is not None:
                return Observed(attrs.evolve(state, step_log=_release_steps(state.step_log, obs.request)))
            return Observed(state)
        case Reclaimed():
            if not math.isfinite(obs.at):
                raise ValueError(f"observation time must be finite, not {obs.at!r}")
            notice = ReclaimNotice(obs.provider, obs.at)
            reclaimed = dict(state.reclaimed)
            for machine_id in obs.machine_ids:
                reclaimed.setdefault(machine_id, notice)
            return Observed(attrs.evolve(state, reclaimed=reclaimed))
        case SnapshotSeqReset():
            return Observed(attrs.evolve(state, applied_seq=-1))
        case IntentRefused():
            if not math.isfinite(obs.at):
                raise ValueError(f"observation time must be finite, not {obs.at!r}")
            previous = state.intent_backoff
            if obs.at < previous.until:
                return Observed(state)  # an action already in flight when the window opened: no escalation
            quiet = obs.at - previous.until > INTENT_BACKOFF_MAX
            attempts = 1 if quiet else previous.attempts + 1
            ceiling = INTENT_BACKOFF_MAX_BY_REASON.get(obs.reason, INTENT_BACKOFF_MAX)
            delay = min(ceiling, INTENT_BACKOFF_BASE * 2.0 ** min(attempts - 1, 60))
            backoff = IntentBackoff(attempts, obs.at + delay)
            note = Note(
                "intents_refused",
                f"controller refused an intent ({obs.reason}) {attempts} in a row: "
                f"plan nothing until {backoff.until:.1f}",
                obs.provider,
            )
            return Observed(attrs.evolve(state, intent_backoff=backoff), (note,))
    raise TypeError(f"not an observation: {obs!r}")


def ramp_step(ramps: Mapping[str, Ramp], provider: str, policy: Policy) -> int | None:
    """``provider``'s step in force (``None``: it has no step limit of its own, so it is not ramped)."""
    own = policy.of(provider)
    if own.step_limit is None:
        return None
    return current(ramps.get(provider), own.step_limit, own.max_machines)


def advance_ramp(ramps: Mapping[str, Ramp], provider: str, outcome: Outcome, policy: Policy) -> Mapping[str, Ramp]:
    """``ramps`` after ``outcome`` for ``provider`` (the same mapping when nothing changes or it is not ramped)."""
    own = policy.of(provider)
    if own.step_limit is None:
        return ramps
    before = ramps.get(provider)
    after = advance(before, outcome, own.step_limit, own.max_machines)
    return ramps if after is before else {**ramps, provider: after}


def _ramped(ramps: Mapping[str, Ramp], obs: CapacityObservation, policy: Policy) -> Mapping[str, Ramp]:
    """What a capacity observation means for the provider's step: an accepted request may double it; running out
    of capacity or a throttle halves it (:mod:`provisionerd.planner.ramp`)."""
    match obs:
        case CallSucceeded(action="requestMachines") if obs.op_id:
            return advance_ramp(ramps, obs.provider, Accepted(obs.op_id), policy)
        case CapacityUnavailable():
            return advance_ramp(ramps, obs.provider, Refused("capacity_unavailable"), policy)
        case Throttled():
            return advance_ramp(ramps, obs.provider, Refused("throttled"), policy)
    return ramps


def _release_steps(
    step_log: tuple[tuple[float, str, int], ...], request: PendingRequest
) -> tuple[tuple[float, str, int], ...]:
    """``step_log`` without ``request``'s machines: its plan's entry for its provider (the plan that made it, at
    ``planned_at``) loses ``count``, and goes when nothing is left."""
    released: list[tuple[float, str, int]] = []
    left = request.count
    for at, provider, n in step_log:
        if left and at == request.planned_at and provider == request.provider:
            taken = min(n, left)
            left -= taken
            n -= taken
            if n == 0:
                continue
        released.append((at, provider, n))
    return tuple(released)
