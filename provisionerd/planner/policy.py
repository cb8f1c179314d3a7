"""The reconciler's knobs: deadlines, back-off, caps and the step limit, per provider. Frozen values checked on
construction.

All durations are seconds on the planner's clock (the ``now`` passed to :func:`provisionerd.planner.plan.plan`, which
must be the same wall clock that stamps ``launch_time`` and ``HostState.since``).

Every knob that says how long a machine may live or wait, how a provider backs off and how much may be asked of it
is a :class:`ProviderPolicy`, one per provider (``Policy.providers``, built from the config in one place:
``provisionerd.daemon.builder.policy_from_config``). The planner reads a machine's, intent's or offer's knob with
``policy.of(provider)``; a provider with no entry gets the defaults the ``Policy``'s own fields give (and its cap from
``provider_caps``), so a one-provider test can still say ``Policy(join_deadline=60)``. The orphan cycle reads the
same ``ProviderPolicy.join_deadline``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import attrs

from provisionerd.domain.errors import ConfigError
from provisionerd.planner.headroom import Headroom


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _is_count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _template_ids(value: object) -> frozenset[str]:
    """A collection of template ids as a set (a lone string is refused, not split into letters)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        problem = f"unverified_templates: must be a list of template ids, not {value!r}"
        raise ConfigError("invalid provider policy", [problem])
    return frozenset(value)


_DURATIONS = (
    "join_deadline",
    "idle_time",
    "provisioning_timeout",
    "capacity_backoff",
    "throttle_base",
    "throttle_max",
    "quota_pause",
    "unhealthy_base",
    "unhealthy_max",
    "drain_timeout",
)
_PROVIDER_KNOBS = (
    *_DURATIONS,
    "rejoin_settle",
    "max_ttl",
    "step_limit",
    "max_machines",
    "disruption_budget",
    "disruption_budget_percent",
    "disruption_interval",
    "max_unhealthy",
    "max_unhealthy_percent",
    "max_unhealthy_window",
    "priority",
    "max_gpus",
    "max_ncpus",
    "max_mem_mb",
    "template_priority",
    "unverified_templates",
)
#: The resource limits a provider may have (``ProviderPolicy``), each with the offer attribute it sums
#: (``ParsedOffer``'s field) and how ``explain`` names it.
RESOURCE_LIMITS = (("max_gpus", "gpus"), ("max_ncpus", "ncpus"), ("max_mem_mb", "mem_mb"))


def _problems(values: Mapping[str, object]) -> list[str]:
    """Every invalid provider knob in ``values`` (the ones present)."""
    problems = []
    for name in _DURATIONS:
        value = values.get(name, 1.0)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and _positive(value)):
            problems.append(f"{name}: must be a positive number of seconds, not {value!r}")
    settle = values.get("rejoin_settle", 0.0)
    if not (
        isinstance(settle, (int, float)) and not isinstance(settle, bool) and math.isfinite(settle) and settle >= 0
    ):
        problems.append(f"rejoin_settle: must be a number of seconds >= 0, not {settle!r}")
    ttl = values.get("max_ttl")
    if ttl is not None and not (isinstance(ttl, (int, float)) and _positive(ttl)):
        problems.append(f"max_ttl: must be a positive number of seconds or None, not {ttl!r}")
    step = values.get("step_limit")
    if step is not None and not _is_count(step, 1):
        problems.append(f"step_limit: must be an integer >= 1 or None, not {step!r}")
    cap = values.get("max_machines")
    if cap is not None and not _is_count(cap, 0):
        problems.append(f"max_machines: must be an integer >= 0 or None, not {cap!r}")
    budget = values.get("disruption_budget")
    if budget is not None and not _is_count(budget, 0):
        problems.append(f"disruption_budget: must be an integer >= 0 or None, not {budget!r}")
    percent = values.get("disruption_budget_percent")
    if percent is not None and not (
        isinstance(percent, (int, float)) and not isinstance(percent, bool) and 0 <= percent <= 100
    ):
        problems.append(f"disruption_budget_percent: must be a number from 0 to 100 or None, not {percent!r}")
    interval = values.get("disruption_interval", 1.0)
    if not (isinstance(interval, (int, float)) and not isinstance(interval, bool) and _positive(interval)):
        problems.append(f"disruption_interval: must be a positive number of seconds, not {interval!r}")
    priority = values.get("priority", 0)
    if not _is_count(priority, 0):
        problems.append(f"priority: must be an integer >= 0, not {priority!r}")
    unverified = values.get("unverified_templates", frozenset())
    if not (isinstance(unverified, frozenset) and all(isinstance(t, str) and t for t in unverified)):
        problems.append(f"unverified_templates: must be a set of template ids (or '*'), not {unverified!r}")
    templates = values.get("template_priority") or {}
    for template, value in templates.items() if isinstance(templates, Mapping) else ():
        if not _is_count(value, 0):
            problems.append(f"template_priority.{template}: must be an integer >= 0, not {value!r}")
    for name, _ in RESOURCE_LIMITS:
        limit = values.get(name)
        if limit is not None and not _is_count(limit, 0):
            problems.append(f"{name}: must be an integer >= 0 or None, not {limit!r}")
    problems += _health_problems(values)
    return problems


def _health_problems(values: Mapping[str, object]) -> list[str]:
    """``max_unhealthy`` and its window (``planner.health``)."""
    problems = []
    count = values.get("max_unhealthy")
    if count is not None and not _is_count(count, 0):
        problems.append(f"max_unhealthy: must be an integer >= 0 or None, not {count!r}")
    percent = values.get("max_unhealthy_percent")
    if percent is not None and not (
        isinstance(percent, (int, float)) and not isinstance(percent, bool) and 0 <= percent <= 100
    ):
        problems.append(f"max_unhealthy_percent: must be a number from 0 to 100 or None, not {percent!r}")
    window = values.get("max_unhealthy_window", 1.0)
    if not (isinstance(window, (int, float)) and not isinstance(window, bool) and _positive(window)):
        problems.append(f"max_unhealthy_window: must be a positive number of seconds, not {window!r}")
    return problems


@attrs.frozen
class ProviderPolicy:
    """One provider's knobs (the ones :class:`Policy` documents), applied to that provider's machines only.

    ``step_limit``: the floor of this provider's adaptive step, the most new machines requested from it in any
    sliding ``Policy.step_interval`` (:mod:`provisionerd.planner.ramp`: it starts here, doubles per accepted round
    while demand uses all of it, halves on ``capacity_unavailable`` or ``throttled``, up to ``max_machines``;
    ``None``: not ramped, only the global ``Policy.step_limit`` binds). ``max_machines``: most machines (live +
    requested) at this provider (``None``: uncapped). ``disruption_budget`` / ``disruption_budget_percent`` /
    ``disruption_interval``: at most that many machines (or percent of the live ones, rounded up) returned
    voluntarily in any sliding interval (:mod:`provisionerd.planner.budget`; ``None``: no budget).
    """

    join_deadline: float = 900.0
    #: After every (re)join to a controller: how long machines that joined before have to rejoin before any
    #: machine is retired for not joining or for its capabilities (:mod:`provisionerd.planner.rejoin`).
    rejoin_settle: float = 120.0
    idle_time: float = 300.0
    max_ttl: float | None = None
    provisioning_timeout: float = 1200.0
    capacity_backoff: float = 180.0
    throttle_base: float = 2.0
    throttle_max: float = 300.0
    quota_pause: float = 900.0
    unhealthy_base: float = 30.0
    unhealthy_max: float = 1800.0
    step_limit: int | None = None
    max_machines: int | None = None
    disruption_budget: int | None = None
    disruption_budget_percent: float | None = None
    disruption_interval: float = 60.0
    drain_timeout: float = 3600.0
    #: More unhealthy machines than this (and/or this percent of the live ones) within ``max_unhealthy_window``
    #: stops replacement at this provider (:mod:`provisionerd.planner.health`; ``None``: never stops).
    max_unhealthy: int | None = None
    max_unhealthy_percent: float | None = None
    max_unhealthy_window: float = 600.0
    #: Lower first: an offer of this provider is chosen before any offer of a provider with a higher number, and
    #: among the surplus idle machines of one demand item the highest number is returned first. A higher number is
    #: used only when every offer before it is full, backed off, unhealthy or incompatible (price orders offers of
    #: one priority). 0 for everyone: price alone (:mod:`provisionerd.planner.offers`).
    priority: int = 0
    #: The most GPUs, CPUs and MiB of memory this provider's machines may have in all (live + requested +
    #: returning, counted like ``max_machines``, from each machine's template; ``None``: no limit). A request that
    #: would pass one is cut to what fits; an offer whose one machine does not fit is skipped (``planner.allocate``).
    max_gpus: int | None = None
    max_ncpus: int | None = None
    max_mem_mb: int | None = None
    #: A template's own priority, in place of ``priority`` for its offers and its surplus machines.
    template_priority: Mapping[str, int] = attrs.field(factory=dict)
    #: Templates whose machines count as supply without their report confirming the template (``"*"``: every
    #: template of this provider; :mod:`provisionerd.planner.health`). Nothing of theirs is compared: no
    #: ``capability_mismatch`` and no ``unhealthy_after_join``.
    unverified_templates: frozenset[str] = attrs.field(default=frozenset(), converter=_template_ids)

    @functools.cached_property
    def resource_limits(self) -> tuple[tuple[str, str, int], ...]:
        """``(knob, offer attribute, limit)`` for each resource limit set (computed once: a pass reads it per
        request and per offer tried)."""
        return tuple(
            (name, attribute, limit)
            for name, attribute in RESOURCE_LIMITS
            if (limit := getattr(self, name)) is not None
        )

    def __attrs_post_init__(self) -> None:
        problems = _problems({name: getattr(self, name) for name in _PROVIDER_KNOBS})
        if problems:
            raise ConfigError("invalid provider policy", problems)

    def unhealthy_delay(self, code: str, attempts: int) -> float:
        """The back-off before the ``attempts``-th probe of a provider unhealthy with ``code``: doubling from
        ``unhealthy_base`` (``quota_pause`` for ``quota_exceeded``: a quota rarely comes back within seconds) up to
        ``unhealthy_max`` (or the first step, when that is longer)."""
        first = self.quota_pause if code == "quota_exceeded" else self.unhealthy_base
        return min(max(self.unhealthy_max, first), first * 2.0 ** min(max(attempts, 1) - 1, 60))


@attrs.frozen
class Policy:
    """How the planner turns demand into requests and returns.

    Global (all providers):

    - ``cluster`` names this cluster in every op_id (and in the owner tags the driver adds).
    - ``step_limit``/``step_interval``: at most ``step_limit`` new machines requested in any sliding window of
      ``step_interval`` seconds, over all providers (each provider's own ``ProviderPolicy.step_limit`` binds too).
    - ``return_batch``: most machines in one ``ReturnMachines`` action.
    - ``reclaim_memory``: how long a reclaim notice for a machine the facts do not (yet) show is remembered.
    - ``providers``: the :class:`ProviderPolicy` of each named provider.

    Per provider (the defaults for a provider not in ``providers``; ``of(provider)`` gives the values in force):

    - ``join_deadline``: a machine not joined this long after launch is returned (``never_joined``).
    - ``rejoin_settle``: after every (re)join to a controller, no machine is retired for not joining or for its
      capabilities until the machines that joined before have rejoined, or this long (:mod:`planner.rejoin`).
    - ``idle_time``: a joined machine idle this long is returned when demand no longer needs it.
    - ``max_ttl``: a machine this old is retired, needed or not (``None`` = never): at once when idle; a busy one
      is asked to drain (``planner.drain``: the controller places no new work on it) and returned when it goes
      idle, or ``drain_timeout`` after the drain was asked, busy or not.
    - ``provisioning_timeout``: an intent still open this long after it was planned (or first seen, after a
      restart) is failed and its machines that have not joined are returned.
    - ``capacity_backoff``: how long an offer stays unavailable after ``capacity_unavailable``.
    - ``throttle_base``/``throttle_max``: exponential back-off per provider after ``throttled`` (jittered to
      between half and all of ``min(throttle_max, throttle_base * 2**(n-1))`` for the n-th throttle in a row).
    - ``unhealthy_base``/``unhealthy_max``/``quota_pause``: a provider that answered ``auth_failed``,
      ``invalid_request`` or ``quota_exceeded`` is unhealthy (:mod:`provisionerd.planner.capacity`): nothing is
      asked of it until a probe succeeds, the n-th probe ``ProviderPolicy.unhealthy_delay`` after the n-th failure.
    - ``provider_caps``: most machines (live + requested) per provider not in ``providers``; others are uncapped.
    """

    cluster: str = "cluster"
    join_deadline: float = 900.0
    rejoin_settle: float = 120.0
    idle_time: float = 300.0
    max_ttl: float | None = None
    provisioning_timeout: float = 1200.0
    capacity_backoff: float = 180.0
    throttle_base: float = 2.0
    throttle_max: float = 300.0
    quota_pause: float = 900.0
    unhealthy_base: float = 30.0
    unhealthy_max: float = 1800.0
    drain_timeout: float = 3600.0
    step_limit: int = 100
    step_interval: float = 60.0
    provider_caps: Mapping[str, int] = attrs.field(factory=dict)
    return_batch: int = 100
    reclaim_memory: float = 3600.0
    providers: Mapping[str, ProviderPolicy] = attrs.field(factory=dict)
    #: ``[cost]``: a cap per machine-hour for items without their own, and the currency of caps that name none.
    cost_cap: float | None = None
    cost_currency: str = ""
    #: Warm headroom rules (``planner.headroom``): ``min_idle`` machines per template kept above the demand.
    headroom: tuple[Headroom, ...] = ()
    # Derived in __attrs_post_init__ (frozen: set once), read on the planner's hot paths.
    _default: ProviderPolicy = attrs.field(init=False, eq=False, repr=False)
    _capped: Mapping[str, ProviderPolicy] = attrs.field(init=False, eq=False, repr=False)
    #: The shortest join deadline of any provider (the default's included): the planner reads not-joined machines
    #: launched before ``now - min_join_deadline`` and checks each against its own provider's deadline.
    min_join_deadline: float = attrs.field(init=False, eq=False, repr=False)
    #: Whether any provider has a ``max_ttl`` (else the planner skips that pass), and the shortest one (``inf``:
    #: none): the drain pass reads only machines launched before ``now - min_max_ttl`` (``planner.drain``).
    any_max_ttl: bool = attrs.field(init=False, eq=False, repr=False)
    min_max_ttl: float = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        problems = []
        if not self.cluster or any(c in self.cluster for c in ":/ "):
            problems.append(f"cluster: must be non-empty without ':', '/' or spaces, not {self.cluster!r}")
        defaults = {name: getattr(self, name) for name in (*_DURATIONS, "max_ttl", "rejoin_settle")}
        problems.extend(_problems(defaults))
        for name in ("step_interval", "reclaim_memory"):
            if not _positive(getattr(self, name)):
                problems.append(f"{name}: must be a positive number of seconds, not {getattr(self, name)!r}")
        for name in ("step_limit", "return_batch"):
            if not _is_count(getattr(self, name), 1):
                problems.append(f"{name}: must be an integer >= 1, not {getattr(self, name)!r}")
        for provider, cap in self.provider_caps.items():
            if not _is_count(cap, 0):
                problems.append(f"provider_caps.{provider}: must be an integer >= 0, not {cap!r}")
            elif provider in self.providers:
                problems.append(f"provider_caps.{provider}: set max_machines in providers.{provider} instead")
        for provider, own in self.providers.items():
            if not isinstance(own, ProviderPolicy):
                problems.append(f"providers.{provider}: must be a ProviderPolicy, not {own!r}")
        seen: set[str] = set()
        for rule in self.headroom:
            if not _is_count(rule.min_idle, 0):
                problems.append(f"headroom {rule.demand_id}: min_idle must be an integer >= 0, not {rule.min_idle!r}")
            if rule.demand_id in seen:
                problems.append(f"headroom {rule.demand_id}: one rule per template")
            seen.add(rule.demand_id)
        if problems:
            raise ConfigError("invalid reconcile policy", problems)
        default = ProviderPolicy(
            join_deadline=self.join_deadline,
            rejoin_settle=self.rejoin_settle,
            idle_time=self.idle_time,
            max_ttl=self.max_ttl,
            provisioning_timeout=self.provisioning_timeout,
            capacity_backoff=self.capacity_backoff,
            throttle_base=self.throttle_base,
            throttle_max=self.throttle_max,
            quota_pause=self.quota_pause,
            unhealthy_base=self.unhealthy_base,
            unhealthy_max=self.unhealthy_max,
            drain_timeout=self.drain_timeout,
        )
        capped = {p: attrs.evolve(default, max_machines=cap) for p, cap in self.provider_caps.items()}
        everyone = (default, *self.providers.values())
        object.__setattr__(self, "_default", default)
        object.__setattr__(self, "_capped", capped)
        object.__setattr__(self, "min_join_deadline", min(p.join_deadline for p in everyone))
        ttls = [p.max_ttl for p in everyone if p.max_ttl is not None]
        object.__setattr__(self, "any_max_ttl", bool(ttls))
        object.__setattr__(self, "min_max_ttl", min(ttls, default=math.inf))

    def of(self, provider: str) -> ProviderPolicy:
        """The knobs in force for ``provider``'s machines, intents and offers."""
        own = self.providers.get(provider)
        if own is not None:
            return own
        return self._capped.get(provider, self._default)

    def surplus_key(self, provider: str, since: float, machine_id: str, template: str = "") -> tuple[int, float, str]:
        """The order the surplus idle machines of one demand item are given away in: the highest priority number
        first (on-premises freed: the cloud's go first; a template's own priority replaces its provider's), then the
        longest idle, then machine id (``allocate.excess_pool`` and ``outlook.surplus_ranks`` both sort by it)."""
        own = self.of(provider)
        priority = own.template_priority.get(template, own.priority) if own.template_priority else own.priority
        return (-priority, since, machine_id)

    @property
    def priorities(self) -> dict[str, int]:
        """Each provider's ``priority`` that is not 0 (the offers' choice order: :class:`planner.offers.Catalog`)."""
        return {name: own.priority for name, own in self.providers.items() if own.priority}

    @property
    def unverified(self) -> frozenset[tuple[str, str]]:
        """The templates not verified (``ProviderPolicy.unverified_templates``), by offer key (``"*"`` kept)."""
        return frozenset(
            (name, template) for name, own in self.providers.items() for template in own.unverified_templates
        )

    @property
    def template_priorities(self) -> dict[tuple[str, str], int]:
        """Each template's own priority (``ProviderPolicy.template_priority``), by offer key."""
        return {
            (name, template): priority
            for name, own in self.providers.items()
            for template, priority in own.template_priority.items()
        }
