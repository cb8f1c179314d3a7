"""What a failed call means for the planner: the one place that turns a provider error or a gate refusal into a
planner observation.

A provider's typed refusal is a fact about the provider, and the planner must act on it before it plans the same
call again:

- ``capacity_unavailable`` for a template: that offer is unavailable for a while (``CapacityUnavailable``);
- ``throttled``: the provider backs off (``Throttled``);
- ``quota_exceeded``: no new requests on that provider for ``policy.quota_pause`` (``QuotaExceeded``);
- anything else says nothing about the provider beyond this one call: no observation.

A refusal at the gate whose reason says the controller cannot take intents for now (``no_quorum``,
``not_primary``, a broken link: ``provisionerd.planner.state.BACKOFF_CODES``) becomes ``IntentRefused``, so the
loop plans nothing until that back-off ends instead of replanning the same work at once under a fresh op_id.

Pure: no I/O, the time is passed in. The provider's error is read by its ``code`` (``getattr(exc, "code", "")``)
until the typed provider boundary replaces it; then only ``provider_error_observation`` changes.
"""

from __future__ import annotations

from provisionerd.domain.errors import ControllerRejected, ProviderError
from provisionerd.planner.capacity import CapacityUnavailable, QuotaExceeded, Throttled
from provisionerd.planner.state import BACKOFF_CODES, IntentRefused, Observation


def provider_error_observation(
    provider: str, template_id: str, error: ProviderError, at: float
) -> CapacityUnavailable | Throttled | QuotaExceeded | None:
    """The observation ``error`` from ``provider`` makes at wall time ``at`` (``None``: it makes none).
    ``template_id`` is the template the call asked for (``""`` for calls that name none: no offer to mark)."""
    code = getattr(error, "code", "")
    if code == "capacity_unavailable" and template_id:
        return CapacityUnavailable(provider, template_id, at)
    if code == "throttled":
        return Throttled(provider, at)
    if code == "quota_exceeded":
        return QuotaExceeded(provider, at, getattr(error, "message", ""))
    return None


def gate_code(exc: Exception) -> str:
    """The code a gate refusal is reported with: the controller's rejection reason, else the error's type name."""
    return exc.reason if isinstance(exc, ControllerRejected) else type(exc).__name__


def gate_refusal_observation(provider: str, exc: Exception, at: float) -> Observation | None:
    """``IntentRefused`` when the gate's refusal ``exc`` means the controller takes no intents for now."""
    code = gate_code(exc)
    return IntentRefused(provider, code, at) if code in BACKOFF_CODES else None
