"""The executor's values: settings, outcomes, and the per-call record of planner observations."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from provisionerd.domain.errors import ControllerRejected, LeaseError, LinkDown
from provisionerd.planner.state import Observation
from provisionerd.provider.values import MachineLimits

GATE_ERRORS = (LeaseError, ControllerRejected, LinkDown)


@attrs.frozen
class ExecutorSettings:
    """``poll_*``: ``getRequestStatus`` back-off on trio's clock (first poll ``poll_initial`` after the call).
    ``provisioning_timeout``/``return_timeout``: how long a request/return is polled; ``provider_timeouts`` gives
    a provider its own (both, from its configured ``provisioning_timeout``): read them with :meth:`request_timeout`
    and :meth:`return_timeout_of`. ``retries``: same-op_id retries after an unknown outcome, ``retry_delay`` apart
    (doubling)."""

    cluster: str
    controllers: tuple[str, ...]
    poll_initial: float = 1.0
    poll_max: float = 15.0
    poll_multiplier: float = 2.0
    provisioning_timeout: float = 1200.0
    return_timeout: float = 1200.0
    retries: int = 3
    retry_delay: float = 1.0
    provider_timeouts: Mapping[str, float] = attrs.field(factory=dict)
    #: Per provider: what its new machines are told about their own lifetime (default: no limits).
    machine_limits: Mapping[str, MachineLimits] = attrs.field(factory=dict)

    def limits_of(self, provider: str) -> MachineLimits:
        return self.machine_limits.get(provider, MachineLimits())

    def request_timeout(self, provider: str) -> float:
        """How long a request to ``provider`` is polled."""
        return self.provider_timeouts.get(provider, self.provisioning_timeout)

    def return_timeout_of(self, provider: str) -> float:
        """How long a return to ``provider`` is polled."""
        return self.provider_timeouts.get(provider, self.return_timeout)


@attrs.frozen
class RequestOutcome:
    """``status``: fulfilled | partial | rejected | dropped | timed_out | unknown. ``machine_ids``: machines
    committed as instance facts by this call. ``code``: the provider's error code or the gate's refusal."""

    op_id: str
    provider: str
    status: str
    machine_ids: tuple[str, ...] = ()
    observations: tuple[Observation, ...] = ()
    code: str = ""
    detail: str = ""


@attrs.frozen
class ReturnOutcome:
    """``status``: returned | partial | rejected | dropped | unknown. ``returned``: machines in the ``Returned``."""

    op_id: str
    provider: str
    status: str
    returned: tuple[str, ...] = ()
    observations: tuple[Observation, ...] = ()
    code: str = ""
    detail: str = ""
