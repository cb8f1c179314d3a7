"""Provider back-off memory: offers out of capacity, throttled providers, providers paused on quota.

Pure. The driver turns typed provider errors into the observation values below and folds them with
:func:`provisionerd.planner.state.observe`; the planner reads the result through :meth:`CapacityState.offer_block`,
:meth:`CapacityState.throttled` and :meth:`CapacityState.paused_reason`. Every entry ends at a time on the
planner's clock, so the memory prunes itself and stays bounded by the number of offers and providers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import attrs

from provisionerd.domain.actions import Note
from provisionerd.planner.offers import OfferKey, format_key
from provisionerd.planner.policy import Policy

# --- observations the driver feeds from provider errors --------------------------------------------------------


@attrs.frozen
class CapacityUnavailable:
    """``requestMachines`` for this template failed with ``capacity_unavailable`` at ``at``."""

    provider: str
    template_id: str
    at: float


@attrs.frozen
class Throttled:
    """A call to ``provider`` failed with ``throttled`` at ``at``.

    ``jitter`` in ``[0, 1]`` picks where in ``[delay/2, delay]`` the back-off ends; ``None`` draws it
    deterministically from the state's ``jitter_seed``, the provider and the attempt number.
    """

    provider: str
    at: float
    jitter: float | None = None


@attrs.frozen
class QuotaExceeded:
    """A call to ``provider`` failed with ``quota_exceeded``: no new requests there for ``policy.quota_pause``."""

    provider: str
    at: float
    detail: str = ""


@attrs.frozen
class CallSucceeded:
    """A call to ``provider`` succeeded: its throttle back-off starts over."""

    provider: str


@attrs.frozen
class ProviderResumed:
    """An operator (or a later quota check) lifts the quota pause on ``provider``."""

    provider: str


CapacityObservation = CapacityUnavailable | Throttled | QuotaExceeded | CallSucceeded | ProviderResumed

# --- the memory ------------------------------------------------------------------------------------------------


@attrs.frozen
class Throttle:
    attempts: int  # throttles in a row since the last success
    until: float


@attrs.frozen
class Pause:
    until: float
    detail: str


@attrs.frozen
class CapacityState:
    """Frozen; every change returns a new value. The mappings are never mutated after construction."""

    unavailable: Mapping[OfferKey, float] = attrs.field(factory=dict)  # offer -> unavailable until
    throttles: Mapping[str, Throttle] = attrs.field(factory=dict)
    paused: Mapping[str, Pause] = attrs.field(factory=dict)
    jitter_seed: int = 0

    def offer_block(self, key: OfferKey, now: float) -> str | None:
        """Why no new request may go to offer ``key`` now (``None`` = it may)."""
        paused = self.paused_reason(key[0], now)
        if paused is not None:
            return paused
        until = self.throttled(key[0], now)
        if until is not None:
            return f"provider {key[0]!r} throttled until {until:.1f}"
        until = self.unavailable.get(key)
        if until is not None and now < until:
            return f"capacity_unavailable until {until:.1f}"
        return None

    def paused_reason(self, provider: str, now: float) -> str | None:
        pause = self.paused.get(provider)
        if pause is None or now >= pause.until:
            return None
        return f"provider {provider!r} paused (quota_exceeded) until {pause.until:.1f}"

    def throttled(self, provider: str, now: float) -> float | None:
        """The end of ``provider``'s back-off if it is still running at ``now``."""
        throttle = self.throttles.get(provider)
        if throttle is None or now >= throttle.until:
            return None
        return throttle.until

    def pruned(self, now: float) -> CapacityState:
        """Drop windows that ended. A throttle's attempt count survives its window until a success resets it."""
        unavailable = {k: u for k, u in self.unavailable.items() if now < u}
        paused = {p: v for p, v in self.paused.items() if now < v.until}
        if len(unavailable) == len(self.unavailable) and len(paused) == len(self.paused):
            return self
        return attrs.evolve(self, unavailable=unavailable, paused=paused)


def _unit_jitter(seed: int, provider: str, attempt: int) -> float:
    digest = hashlib.blake2b(f"{seed}\0{provider}\0{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _check_time(at: float) -> None:
    if not math.isfinite(at):
        raise ValueError(f"observation time must be finite, not {at!r}")


def apply_capacity(
    state: CapacityState, obs: CapacityObservation, policy: Policy
) -> tuple[CapacityState, tuple[Note, ...]]:
    """Fold one capacity observation into ``state``; return the new state and notes to log or raise as events."""
    match obs:
        case CapacityUnavailable():
            _check_time(obs.at)
            key = (obs.provider, obs.template_id)
            until = max(state.unavailable.get(key, obs.at), obs.at + policy.capacity_backoff)
            note = Note("offer_unavailable", f"{format_key(key)} unavailable until {until:.1f}", obs.provider)
            return attrs.evolve(state, unavailable={**state.unavailable, key: until}), (note,)
        case Throttled():
            _check_time(obs.at)
            if obs.jitter is not None and not 0.0 <= obs.jitter <= 1.0:
                raise ValueError(f"jitter must be within [0, 1], not {obs.jitter!r}")
            previous = state.throttles.get(obs.provider)
            attempts = 1 if previous is None else previous.attempts + 1
            delay = min(policy.throttle_max, policy.throttle_base * 2.0 ** min(attempts - 1, 60))
            jitter = _unit_jitter(state.jitter_seed, obs.provider, attempts) if obs.jitter is None else obs.jitter
            until = obs.at + delay * (0.5 + 0.5 * jitter)
            if previous is not None:
                until = max(until, previous.until)
            detail = f"throttle {attempts} in a row: back off until {until:.1f}"
            note = Note("provider_throttled", detail, obs.provider)
            throttles = {**state.throttles, obs.provider: Throttle(attempts, until)}
            return attrs.evolve(state, throttles=throttles), (note,)
        case QuotaExceeded():
            _check_time(obs.at)
            pause = Pause(obs.at + policy.quota_pause, obs.detail)
            detail = f"quota_exceeded: no new requests until {pause.until:.1f}" + (
                f" ({obs.detail})" if obs.detail else ""
            )
            return attrs.evolve(state, paused={**state.paused, obs.provider: pause}), (
                Note("provider_paused", detail, obs.provider),
            )
        case CallSucceeded():
            if obs.provider not in state.throttles:
                return state, ()
            throttles = {p: t for p, t in state.throttles.items() if p != obs.provider}
            return attrs.evolve(state, throttles=throttles), ()
        case ProviderResumed():
            if obs.provider not in state.paused:
                return state, ()
            paused = {p: v for p, v in state.paused.items() if p != obs.provider}
            return attrs.evolve(state, paused=paused), (Note("provider_resumed", "quota pause lifted", obs.provider),)
    raise TypeError(f"not a capacity observation: {obs!r}")
