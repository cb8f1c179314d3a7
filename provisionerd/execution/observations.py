"""What a failed call means for the planner: the one place that turns a provider error or a gate refusal into a
planner observation.

A provider's typed refusal is a fact about the provider, and the planner must act on it before it plans the same
call again:

- ``errors.CapacityUnavailable`` for a template: that offer is unavailable for a while
  (``planner.capacity.CapacityUnavailable``); so is a request refused with ``provider_error`` (``ProviderFailed``,
  its listing showing nothing made): asked again at once, it is refused again;
- ``errors.Throttled``: the provider backs off (``planner.capacity.Throttled``);
- ``errors.AuthFailed``, ``errors.InvalidRequest`` (``ProviderInputInvalid`` included) and ``errors.QuotaExceeded``:
  the provider will refuse the next call just the same, so it is unhealthy (``planner.capacity.ProviderUnhealthy``):
  nothing is asked of it but one probe per back-off step until a probe succeeds;
- anything else says nothing about the provider beyond this one call: no observation.

A refusal at the gate whose reason says the controller cannot take intents for now (``no_quorum``,
``not_primary``, a broken link: ``provisionerd.planner.state.BACKOFF_CODES``) becomes ``IntentRefused``, so the
loop plans nothing until that back-off ends instead of replanning the same work at once under a fresh op_id.

Pure: no I/O, the time is passed in. The provider's error is read by its class (``provisionerd.domain.errors``:
one ``ProviderRejected`` subclass per code).
"""

from __future__ import annotations

from provisionerd.domain import errors
from provisionerd.domain.errors import ControllerRejected, ProviderError
from provisionerd.planner.capacity import CapacityUnavailable, ProviderUnhealthy, Throttled
from provisionerd.planner.state import BACKOFF_CODES, IntentRefused, Observation


def provider_error_observation(
    provider: str, template_id: str, error: ProviderError, at: float
) -> CapacityUnavailable | Throttled | ProviderUnhealthy | None:
    """The observation ``error`` from ``provider`` makes at wall time ``at`` (``None``: it makes none).
    ``template_id`` is the template the call asked for (``""`` for calls that name none: no offer to mark)."""
    match error:
        case errors.CapacityUnavailable() if template_id:
            return CapacityUnavailable(provider, template_id, at)
        case errors.ProviderFailed() if template_id:
            # A request refused with ``provider_error`` (its listing showed nothing made) would be refused again at
            # once: the template rests like one out of capacity, instead of a new intent every cycle (a legacy
            # plugin refused 40 requests in 6 s: "4 running + 1 requested > maxNumber", bench/restarts.py).
            return CapacityUnavailable(provider, template_id, at)
        case errors.Throttled():
            return Throttled(provider, at)
        case errors.AuthFailed() | errors.InvalidRequest() | errors.QuotaExceeded():
            return ProviderUnhealthy(provider, error.code, at, error.message)
    return None


def refusal_code(error: ProviderError) -> str:
    """The code a failed provider call is reported with: a refusal's own code, else the error's type name."""
    return error.code if isinstance(error, errors.ProviderRejected) else type(error).__name__


def gate_code(exc: Exception) -> str:
    """The code a gate refusal is reported with: the controller's rejection reason, else the error's type name."""
    return exc.reason if isinstance(exc, ControllerRejected) else type(exc).__name__


def gate_refusal_observation(provider: str, exc: Exception, at: float) -> Observation | None:
    """``IntentRefused`` when the gate's refusal ``exc`` means the controller takes no intents for now."""
    code = gate_code(exc)
    return IntentRefused(provider, code, at) if code in BACKOFF_CODES else None
