"""The reconciler's knobs: deadlines, back-off, caps and the step limit. A frozen value checked on construction.

All durations are seconds on the planner's clock (the ``now`` passed to :func:`provisionerd.planner.plan.plan`, which
must be the same wall clock that stamps ``launch_time`` and ``HostState.since``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from provisionerd.domain.errors import ConfigError


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


@attrs.frozen
class Policy:
    """How the planner turns demand into requests and returns.

    - ``cluster`` names this cluster in every op_id (and in the owner tags the driver adds).
    - ``join_deadline``: a machine not joined this long after launch is returned (``never_joined``).
    - ``idle_time``: a joined machine idle this long is returned when demand no longer needs it.
    - ``max_ttl``: a machine this old is retired at its next idle moment, needed or not (``None`` = never).
    - ``provisioning_timeout``: an intent still open this long after it was planned (or first seen, after a
      restart) is failed and its machines that have not joined are returned.
    - ``capacity_backoff``: how long an offer stays unavailable after ``capacity_unavailable``.
    - ``throttle_base``/``throttle_max``: exponential back-off per provider after ``throttled`` (jittered to
      between half and all of ``min(throttle_max, throttle_base * 2**(n-1))`` for the n-th throttle in a row).
    - ``quota_pause``: how long a provider is paused after ``quota_exceeded`` (``ProviderResumed`` ends it early).
    - ``step_limit``/``step_interval``: at most ``step_limit`` new machines requested in any sliding window of
      ``step_interval`` seconds, over all providers.
    - ``provider_caps``: most machines (live + requested) per provider; providers not listed are uncapped.
    - ``return_batch``: most machines in one ``ReturnMachines`` action.
    - ``reclaim_memory``: how long a reclaim notice for a machine the facts do not (yet) show is remembered.
    """

    cluster: str = "cluster"
    join_deadline: float = 900.0
    idle_time: float = 300.0
    max_ttl: float | None = None
    provisioning_timeout: float = 1200.0
    capacity_backoff: float = 180.0
    throttle_base: float = 2.0
    throttle_max: float = 300.0
    quota_pause: float = 900.0
    step_limit: int = 100
    step_interval: float = 60.0
    provider_caps: Mapping[str, int] = attrs.field(factory=dict)
    return_batch: int = 100
    reclaim_memory: float = 3600.0

    def __attrs_post_init__(self) -> None:
        problems = []
        if not self.cluster or any(c in self.cluster for c in ":/ "):
            problems.append(f"cluster: must be non-empty without ':', '/' or spaces, not {self.cluster!r}")
        for name in (
            "join_deadline",
            "idle_time",
            "provisioning_timeout",
            "capacity_backoff",
            "throttle_base",
            "throttle_max",
            "quota_pause",
            "step_interval",
            "reclaim_memory",
        ):
            if not _positive(getattr(self, name)):
                problems.append(f"{name}: must be a positive number of seconds, not {getattr(self, name)!r}")
        if self.max_ttl is not None and not _positive(self.max_ttl):
            problems.append(f"max_ttl: must be a positive number of seconds or None, not {self.max_ttl!r}")
        for name in ("step_limit", "return_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name}: must be an integer >= 1, not {value!r}")
        for provider, cap in self.provider_caps.items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
                problems.append(f"provider_caps.{provider}: must be an integer >= 0, not {cap!r}")
        if problems:
            raise ConfigError("invalid reconcile policy", problems)
