"""Provider back-off memory: offers out of capacity, throttled providers, unhealthy providers.

Pure. The driver turns typed provider errors into the observation values below and folds them with
:func:`provisionerd.planner.state.observe`; the planner reads the result through :meth:`CapacityState.offer_block`,
:meth:`CapacityState.throttled` and :meth:`CapacityState.unhealthy_reason`. Every back-off reads the knobs of its
own provider (``policy.of(provider)``). The memory stays bounded by the number of offers and providers.

**Unhealthy providers.** ``auth_failed``, ``invalid_request`` and ``quota_exceeded`` say the provider will refuse
the next call just the same (credentials, configuration, quota), so asking again at once only mints tokens and
commits intents that fail. :class:`ProviderUnhealthy` makes the provider unhealthy: no request is planned for it,
nor a return unless the code is ``quota_exceeded`` (a return frees quota), so the driver mints no token and commits
no intent for it; and the n-th failure in a row sets the next probe
``ProviderPolicy.unhealthy_delay(code, n)`` later (doubling, capped). A probe is a call that changes nothing (the
driver reads ``getAvailableTemplates``): the driver folds :class:`ProbeStarted` when it makes one (the next step is
reserved at once, so a probe that hangs or fails without a typed refusal costs one call per step, never a burst),
then :class:`ProbeSucceeded` (healthy again) or, through the same error mapping, another :class:`ProviderUnhealthy`.
The failure count survives a successful probe (a probe cannot tell whether the next request is valid or within
quota) and starts over only when a mutation succeeds (:class:`CallSucceeded`), so a provider whose requests keep
failing with ``invalid_request`` costs one intent per back-off step, each step twice as long.

``protocol_violation`` is a plugin that keeps answering create requests with requestIds it does not know
(``execution.request_flow``): its requests wait the same way; its returns do not.

``quota_exceeded`` is this same state: its first step is ``quota_pause`` (it was a fixed pause before; now it
doubles while the quota stays exhausted). :class:`ProviderResumed` (an operator) lifts the state at once.
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


#: The refusal codes that make a provider unhealthy (see the module docstring).
UNHEALTHY_CODES = frozenset({"auth_failed", "invalid_request", "quota_exceeded", "protocol_violation"})


@attrs.frozen
class ProviderUnhealthy:
    """A call to ``provider`` failed at ``at`` with ``code``, one of ``UNHEALTHY_CODES``: it is unhealthy."""

    provider: str
    code: str
    at: float
    detail: str = ""

    def __attrs_post_init__(self) -> None:
        if self.code not in UNHEALTHY_CODES:
            raise ValueError(f"code must be one of {sorted(UNHEALTHY_CODES)}, not {self.code!r}")


@attrs.frozen
class ProbeStarted:
    """The driver starts the probe of unhealthy ``provider`` at ``at`` (its probe was due): the next step is set."""

    provider: str
    at: float


@attrs.frozen
class ProbeSucceeded:
    """The probe of ``provider`` succeeded: it is healthy again (its failure count stays until a mutation works)."""

    provider: str
    at: float


@attrs.frozen
class CallSucceeded:
    """A mutation (``action``) on ``provider`` succeeded: its throttle back-off starts over, and so does its unhealthy
    state and failure count, unless the success proves nothing about what failed: a ``returnMachines`` clears only
    ``auth_failed`` (the credentials work), not a quota or a request found invalid. ``op_id``: the request's, when
    ``action`` is ``requestMachines`` (its acceptance may double the provider's step, :mod:`provisionerd.planner.ramp`).
    """

    provider: str
    action: str = "requestMachines"
    op_id: str = ""


@attrs.frozen
class ProviderResumed:
    """An operator lifts the unhealthy state of ``provider`` (a quota raised, credentials fixed)."""

    provider: str


CapacityObservation = (
    CapacityUnavailable
    | Throttled
    | ProviderUnhealthy
    | ProbeStarted
    | ProbeSucceeded
    | CallSucceeded
    | ProviderResumed
)

# --- the memory ------------------------------------------------------------------------------------------------


@attrs.frozen
class Throttle:
    attempts: int  # throttles in a row since the last success
    until: float


@attrs.frozen
class Unhealthy:
    """Why ``provider`` is unhealthy (``code``, ``detail``), since when, and when its next probe is due."""

    code: str
    detail: str
    since: float
    attempts: int  # failures (and probes started) in a row
    until: float  # the next probe is due at this time

    @property
    def blocks_returns(self) -> bool:
        """Whether returns wait too: not for ``quota_exceeded`` (a return frees quota; only requests need it) nor
        ``protocol_violation`` (create requests answered with ids the plugin does not know: returns are apart)."""
        return self.code not in ("quota_exceeded", "protocol_violation")

    def reason(self, provider: str) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"provider {provider!r} unhealthy ({self.code}{detail}): next probe at {self.until:.1f}"


@attrs.frozen
class CapacityState:
    """Frozen; every change returns a new value. The mappings are never mutated after construction."""

    unavailable: Mapping[OfferKey, float] = attrs.field(factory=dict)  # offer -> unavailable until
    throttles: Mapping[str, Throttle] = attrs.field(factory=dict)
    unhealthy: Mapping[str, Unhealthy] = attrs.field(factory=dict)
    strikes: Mapping[str, int] = attrs.field(factory=dict)  # unhealthy failures in a row, kept past a good probe
    jitter_seed: int = 0
    #: Offers whose machine fell short of the template (``planner.health``): offer -> (suspect until, why).
    suspect: Mapping[OfferKey, tuple[float, str]] = attrs.field(factory=dict)
    #: Offers refused for capacity in a row: offer -> (refusals in a row, last back-off's start, its end). Each one
    #: in a row doubles the back-off (``CAPACITY_DOUBLINGS`` at most); a quiet spell as long as the last back-off
    #: after its end forgets them (``pruned``).
    refusals: Mapping[OfferKey, tuple[int, float, float]] = attrs.field(factory=dict)

    def offer_block(self, key: OfferKey, now: float) -> str | None:
        """Why no new request may go to offer ``key`` now (``None`` = it may)."""
        unhealthy = self.unhealthy_reason(key[0])
        if unhealthy is not None:
            return unhealthy
        until = self.throttled(key[0], now)
        if until is not None:
            return f"provider {key[0]!r} throttled until {until:.1f}"
        until = self.unavailable.get(key)
        if until is not None and now < until:
            return f"capacity_unavailable until {until:.1f}"
        suspect = self.suspect.get(key)
        if suspect is not None and now < suspect[0]:
            return f"suspect until {suspect[0]:.1f}: {suspect[1]}"
        return None

    def with_suspect(self, key: OfferKey, until: float, why: str) -> CapacityState:
        """Offer ``key`` suspect until ``until`` (or later, if it was already) because of ``why``."""
        previous = self.suspect.get(key)
        if previous is not None and previous[0] >= until:
            return self
        return attrs.evolve(self, suspect={**self.suspect, key: (until, why)})

    def unhealthy_reason(self, provider: str) -> str | None:
        """Why nothing may be asked of ``provider`` but a probe (``None``: it is healthy). The state lasts until a
        probe succeeds, however long ago the probe fell due."""
        entry = self.unhealthy.get(provider)
        return None if entry is None else entry.reason(provider)

    def refuses(self, provider: str, *, returning: bool = False) -> bool:
        """Whether nothing of that kind (a request; ``returning``: a return) may be asked of ``provider`` now."""
        entry = self.unhealthy.get(provider)
        return entry is not None and (not returning or entry.blocks_returns)

    def probe_due(self, provider: str, now: float) -> bool:
        """Whether ``provider`` is unhealthy and its next probe is due at ``now``."""
        entry = self.unhealthy.get(provider)
        return entry is not None and now >= entry.until

    def throttled(self, provider: str, now: float) -> float | None:
        """The end of ``provider``'s back-off if it is still running at ``now``."""
        throttle = self.throttles.get(provider)
        if throttle is None or now >= throttle.until:
            return None
        return throttle.until

    def pruned(self, now: float) -> CapacityState:
        """Drop windows that ended. A throttle's attempt count survives its window until a success resets it; an
        unhealthy provider stays so until a probe succeeds."""
        state = self
        if self.suspect:
            suspect = {k: s for k, s in self.suspect.items() if now < s[0]}
            if len(suspect) != len(self.suspect):
                state = attrs.evolve(state, suspect=suspect)
        if self.refusals:  # forgotten after a quiet spell as long as the back-off that ended it
            refusals = {k: r for k, r in self.refusals.items() if now < r[2] + (r[2] - r[1])}
            if len(refusals) != len(self.refusals):
                state = attrs.evolve(state, refusals=refusals)
        if not self.unavailable:
            return state
        unavailable = {k: u for k, u in self.unavailable.items() if now < u}
        if len(unavailable) == len(self.unavailable):
            return state
        return attrs.evolve(state, unavailable=unavailable)


def _unit_jitter(seed: int, provider: str, attempt: int) -> float:
    digest = hashlib.blake2b(f"{seed}\0{provider}\0{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _check_time(at: float) -> None:
    if not math.isfinite(at):
        raise ValueError(f"observation time must be finite, not {at!r}")


#: How many times a capacity back-off doubles for refusals in a row (8x the provider's ``capacity_backoff``).
CAPACITY_DOUBLINGS = 3


def capacity_refusals(state: CapacityState, key: OfferKey, at: float) -> int:
    """How many capacity refusals of offer ``key`` came in a row before one at ``at``: those whose back-off ended
    no longer ago than it lasted. Why they double: a request refused for capacity still takes its place in the
    provider's step window, so with a back-off shorter than the window a refused offer of a better priority was
    asked again each time the window freed room, and the offer behind it never was (the simulation's priority
    worlds, issue 35 item 3)."""
    previous = state.refusals.get(key)
    if previous is None:
        return 0
    count, start, end = previous
    return count if at < end + (end - start) else 0


def apply_capacity(
    state: CapacityState, obs: CapacityObservation, policy: Policy
) -> tuple[CapacityState, tuple[Note, ...]]:
    """Fold one capacity observation into ``state``; return the new state and notes to log or raise as events."""
    match obs:
        case CapacityUnavailable():
            _check_time(obs.at)
            key = (obs.provider, obs.template_id)
            in_a_row = capacity_refusals(state, key, obs.at)
            backoff = policy.of(obs.provider).capacity_backoff * 2 ** min(in_a_row, CAPACITY_DOUBLINGS)
            until = max(state.unavailable.get(key, obs.at), obs.at + backoff)
            note = Note("offer_unavailable", f"{format_key(key)} unavailable until {until:.1f}", obs.provider)
            refusals = {**state.refusals, key: (in_a_row + 1, obs.at, until)}
            return attrs.evolve(state, unavailable={**state.unavailable, key: until}, refusals=refusals), (note,)
        case Throttled():
            _check_time(obs.at)
            if obs.jitter is not None and not 0.0 <= obs.jitter <= 1.0:
                raise ValueError(f"jitter must be within [0, 1], not {obs.jitter!r}")
            own = policy.of(obs.provider)
            previous = state.throttles.get(obs.provider)
            attempts = 1 if previous is None else previous.attempts + 1
            delay = min(own.throttle_max, own.throttle_base * 2.0 ** min(attempts - 1, 60))
            jitter = _unit_jitter(state.jitter_seed, obs.provider, attempts) if obs.jitter is None else obs.jitter
            until = obs.at + delay * (0.5 + 0.5 * jitter)
            if previous is not None:
                until = max(until, previous.until)
            detail = f"throttle {attempts} in a row: back off until {until:.1f}"
            note = Note("provider_throttled", detail, obs.provider)
            throttles = {**state.throttles, obs.provider: Throttle(attempts, until)}
            return attrs.evolve(state, throttles=throttles), (note,)
        case ProviderUnhealthy():
            _check_time(obs.at)
            return _failed(state, obs, policy)
        case ProbeStarted():
            _check_time(obs.at)
            entry = state.unhealthy.get(obs.provider)
            if entry is None or obs.at < entry.until:
                return state, ()
            attempts = entry.attempts + 1
            until = obs.at + policy.of(obs.provider).unhealthy_delay(entry.code, attempts)
            entry = attrs.evolve(entry, attempts=attempts, until=until)
            return attrs.evolve(state, unhealthy={**state.unhealthy, obs.provider: entry}), ()
        case ProbeSucceeded():
            entry = state.unhealthy.get(obs.provider)
            if entry is None:
                return state, ()
            detail = f"probe succeeded after {obs.at - entry.since:.1f}s unhealthy ({entry.code})"
            return _healthy(state, obs.provider, entry.attempts), (Note("provider_healthy", detail, obs.provider),)
        case CallSucceeded():
            p = obs.provider
            if p not in state.throttles and p not in state.strikes and p not in state.unhealthy:
                return state, ()
            if p in state.throttles:
                state = attrs.evolve(state, throttles={k: t for k, t in state.throttles.items() if k != p})
            entry = state.unhealthy.get(p)
            if obs.action == "returnMachines" and (entry is None or entry.code != "auth_failed"):
                return state, ()
            notes = (Note("provider_healthy", f"{obs.action} succeeded", p),) if entry is not None else ()
            return _healthy(state, p, None), notes
        case ProviderResumed():
            if obs.provider not in state.unhealthy:
                return state, ()
            note = Note("provider_healthy", "unhealthy state lifted by an operator", obs.provider)
            return _healthy(state, obs.provider, None), (note,)
    raise TypeError(f"not a capacity observation: {obs!r}")


def _failed(state: CapacityState, obs: ProviderUnhealthy, policy: Policy) -> tuple[CapacityState, tuple[Note, ...]]:
    entry = state.unhealthy.get(obs.provider)
    if entry is not None and obs.at < entry.until:
        # A call already in flight when the state began, or the probe of this step failing: the same step, with the
        # latest reason (no escalation: the step was counted when it began).
        if (entry.code, entry.detail) == (obs.code, obs.detail):
            return state, ()
        entry = attrs.evolve(entry, code=obs.code, detail=obs.detail)
        return attrs.evolve(state, unhealthy={**state.unhealthy, obs.provider: entry}), ()
    attempts = (entry.attempts if entry is not None else state.strikes.get(obs.provider, 0)) + 1
    until = obs.at + policy.of(obs.provider).unhealthy_delay(obs.code, attempts)
    since = entry.since if entry is not None else obs.at
    entry = Unhealthy(obs.code, obs.detail, since, attempts, until)
    detail = f"{obs.code} ({attempts} in a row): nothing asked but a probe at {until:.1f}" + (
        f" ({obs.detail})" if obs.detail else ""
    )
    return attrs.evolve(state, unhealthy={**state.unhealthy, obs.provider: entry}), (
        Note("provider_unhealthy", detail, obs.provider),
    )


def _healthy(state: CapacityState, provider: str, strikes: int | None) -> CapacityState:
    """``provider`` healthy; its failure count kept as ``strikes`` (``None``: forgotten)."""
    unhealthy = {p: u for p, u in state.unhealthy.items() if p != provider}
    kept = {p: n for p, n in state.strikes.items() if p != provider}
    if strikes is not None:
        kept[provider] = strikes
    return attrs.evolve(state, unhealthy=unhealthy, strikes=kept)
