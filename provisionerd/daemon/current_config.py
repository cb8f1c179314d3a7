"""The one current-config holder: the config the daemon runs on, what is derived from it, and its reloads.

Every part of the running daemon reads the config through one :class:`CurrentConfig` (``Pieces.current``): the
reconcile loop takes its planner policy from ``current.policy`` at every cycle, each orphan cycle and the admin's
orphan actions read the orphan policy and the cluster from it, ``status()`` shows it. A reload is one atomic switch
(``CurrentConfig.reload``):

1. ``plan_reload(running, new)`` compares the two field by field and sorts every difference into *live* (a path in
   ``LIVE_FIELDS`` / ``LIVE_PROVIDER_FIELDS``) or *needs a restart* (everything else: controller addresses and
   settings, identity, cluster, TLS, lease margin, the daemon's files, the provider set, a provider's transport,
   path, argv, directories, env, timeouts, legacy options and ``provisioning_timeout``, which the executor's polls
   were built with).
2. What needs a restart is not applied: the running value of each such field stays in force until the next start,
   and the fields are named (``restart_needed``) in the log, the event and ``status``. It does not hold the live
   changes back: they are taken from the new config into the running one (``with_live``), and the result is a
   config that differs from the running one only in live fields (outcome ``applied``, with ``restart_needed`` when
   some changes wait for a restart; ``restart_needed`` alone when nothing live changed).
3. Everything derived from that config (the planner policy, each provider's orphan policy) is built first; a knob
   that cannot be built is outcome ``failed`` and nothing is applied. Only then is it installed, as a whole, and
   the result (``ReloadResult``, its ``previous`` config) goes back to the caller.

What a live setting outside the holder does is the caller's, from that returned value (``DaemonCore.reload``: the
orphan cycles take their interval and settle window, the metrics listener moves to a new ``metrics_listen``,
binding it after the switch and staying put, with an ERROR and the event ``metrics_listen_failed``, when it cannot;
``provisionerd run`` sets the log level). A new live setting is added to ``LIVE_FIELDS`` and taken up there; until
then a change of it is reported as needing a restart, the safe side.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs

from provisionerd.config.loader import Config, ProviderConfig
from provisionerd.daemon.orphan_admin import policy_of
from provisionerd.domain.errors import ConfigError
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.planner.headroom import Headroom, parse_hours
from provisionerd.planner.policy import Policy, ProviderPolicy

log = logging.getLogger(__name__)

#: Paths (outside ``providers``) a reload applies without a restart, each ``<section>.<field>``.
LIVE_FIELDS = frozenset({"daemon.log_level", "daemon.metrics_listen"})
#: A provider's fields a reload applies without a restart (``orphans`` covers every orphan knob).
LIVE_PROVIDER_FIELDS = frozenset(
    {
        "max_machines",
        "step_limit",
        "priority",
        "join_deadline",
        "rejoin_settle",
        "idle_time",
        "max_ttl",
        "disruption_budget",
        "disruption_budget_percent",
        "disruption_interval",
        "drain_timeout",
        "max_unhealthy",
        "max_unhealthy_window",
        "capacity_backoff",
        "quota_pause",
        "unhealthy_backoff",
        "unhealthy_backoff_max",
        "orphans",
        "template_priority",
        "unverified_templates",
        "max_gpus",
        "max_ncpus",
        "max_mem_mb",
        "headroom",
    }
)
#: At most this many differences are named (bounded output for a config that changed everywhere).
MAX_NAMED = 50


def provider_policy(provider: ProviderConfig) -> ProviderPolicy:
    """One configured provider's knobs, as the planner and the orphan cycle read them (``max_ttl = 0``: none;
    ``idle_time = 0``: return at once, which the planner spells as a millisecond; ``max_unhealthy``: ``"3"`` or
    ``"40%"``, as the schema allows)."""
    text = provider.max_unhealthy.strip()
    return ProviderPolicy(
        join_deadline=provider.join_deadline,
        rejoin_settle=provider.rejoin_settle,
        idle_time=max(provider.idle_time, 0.001),
        max_ttl=provider.max_ttl if provider.max_ttl > 0 else None,
        provisioning_timeout=provider.provisioning_timeout,
        capacity_backoff=provider.capacity_backoff,
        quota_pause=provider.quota_pause,
        unhealthy_base=provider.unhealthy_backoff,
        unhealthy_max=provider.unhealthy_backoff_max,
        step_limit=provider.step_limit,
        max_machines=provider.max_machines,
        priority=provider.priority,
        template_priority=dict(provider.template_priority),
        unverified_templates=frozenset(provider.unverified_templates),
        max_gpus=provider.max_gpus,
        max_ncpus=provider.max_ncpus,
        max_mem_mb=provider.max_mem_mb,
        disruption_budget=provider.disruption_budget,
        disruption_budget_percent=provider.disruption_budget_percent,
        disruption_interval=provider.disruption_interval,
        drain_timeout=provider.drain_timeout,
        max_unhealthy=None if not text or text.endswith("%") else int(text),
        max_unhealthy_percent=float(text[:-1]) if text.endswith("%") else None,
        max_unhealthy_window=provider.max_unhealthy_window,
    )


def headroom_rules(config: Config) -> tuple[Headroom, ...]:
    """Every provider's ``[[providers.headroom]]`` rules; ``ConfigError`` names each bad ``hours``."""
    rules, problems = [], []
    for provider in config.providers:
        for n, rule in enumerate(provider.headroom):
            try:
                hours = parse_hours(rule.hours)
            except ValueError as exc:
                problems.append(f"providers[{provider.name}].headroom[{n}]: {exc}")
                continue
            rules.append(Headroom(provider.name, rule.template, rule.min_idle, hours))
    if problems:
        raise ConfigError("invalid headroom", problems)
    return tuple(rules)


def policy_from_config(config: Config) -> Policy:
    """The planner's policy: one ``ProviderPolicy`` per configured provider (the global step limit is the sum)."""
    return Policy(
        cluster=config.cluster,
        step_limit=sum(p.step_limit for p in config.providers),
        providers={p.name: provider_policy(p) for p in config.providers},
        cost_cap=config.cost.max_hourly_cost,
        cost_currency=config.cost.currency,
        headroom=headroom_rules(config),
    )


@attrs.frozen
class ReloadPlan:
    """The differences between the running config and a new one: ``live`` (applied by a reload) and ``restart``
    (named; their presence keeps the whole running config in force)."""

    live: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.live or self.restart)


def _differences(old: Any, new: Any, path: str) -> Iterator[str]:
    """The paths where ``old`` and ``new`` differ, descending into attrs values (``source`` is not compared)."""
    if old == new:
        return
    if attrs.has(type(old)) and type(old) is type(new):
        for field in attrs.fields(type(old)):
            if not field.eq:
                continue
            yield from _differences(getattr(old, field.name), getattr(new, field.name), f"{path}.{field.name}")
        return
    yield path


def plan_reload(old: Config, new: Config) -> ReloadPlan:
    """Sort every difference between ``old`` and ``new`` into live and needs-a-restart (module docstring)."""
    live: list[str] = []
    restart: list[str] = []
    for field in attrs.fields(Config):
        if not field.eq or field.name == "providers":
            continue
        for path in _differences(getattr(old, field.name), getattr(new, field.name), field.name):
            (live if path in LIVE_FIELDS else restart).append(path)
    before, after = old.provider_names, new.provider_names
    added = [n for n in after if n not in before]
    removed = [n for n in before if n not in after]
    if added or removed:
        restart.append(f"providers (added {added}, removed {removed})")
    for provider in old.providers:
        if provider.name not in after:
            continue
        mine = new.provider(provider.name)
        for field in attrs.fields(ProviderConfig):
            for path in _differences(getattr(provider, field.name), getattr(mine, field.name), field.name):
                named = f"providers.{provider.name}.{path}"
                (live if field.name in LIVE_PROVIDER_FIELDS else restart).append(named)
    return ReloadPlan(tuple(live[:MAX_NAMED]), tuple(restart[:MAX_NAMED]))


def with_live(running: Config, new: Config) -> Config:
    """``running`` with every live field (``LIVE_FIELDS``, ``LIVE_PROVIDER_FIELDS`` of each provider both have)
    taken from ``new``, and ``new``'s source: what a reload installs. Everything that needs a restart keeps its
    running value, so ``plan_reload(running, with_live(running, new))`` has no ``restart`` part."""
    sections: dict[str, dict[str, Any]] = {}
    for path in LIVE_FIELDS:  # each is "<section>.<field>"
        section, field = path.split(".", 1)
        sections.setdefault(section, {})[field] = getattr(getattr(new, section), field)
    evolved = {name: attrs.evolve(getattr(running, name), **fields) for name, fields in sections.items()}
    after = {p.name: p for p in new.providers}
    providers = tuple(
        attrs.evolve(p, **{f: getattr(after[p.name], f) for f in LIVE_PROVIDER_FIELDS}) if p.name in after else p
        for p in running.providers
    )
    return attrs.evolve(running, **evolved, providers=providers, source=new.source)


@attrs.frozen
class ReloadResult:
    """One reload's outcome: ``applied`` (the live changes, in ``applied``; ``restart_needed`` names what waits for
    a restart) | ``unchanged`` | ``restart_needed`` (only changes that wait for a restart) | ``failed``."""

    outcome: str
    applied: tuple[str, ...] = ()
    restart_needed: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    at: float = 0.0  # wall-clock seconds
    #: The config an ``applied`` reload replaced (what the caller compares to take up live settings).
    previous: Config | None = attrs.field(default=None, eq=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "at": self.at,
            "applied": list(self.applied),
            "restart_needed": list(self.restart_needed),
            "problems": list(self.problems),
        }


class CurrentConfig:
    """The running config and what is derived from it (module docstring). ``policy``: a fixed planner policy
    (tests, the simulation) instead of the one derived from the config; a reload then keeps it."""

    def __init__(self, config: Config, *, policy: Policy | None = None, wall: Callable[[], float] = time.time) -> None:
        self._fixed_policy = policy
        self._wall = wall
        self._config, self._policy, self._orphan = self._derive(config)
        self.last: ReloadResult | None = None
        self.reloads = 0

    @property
    def config(self) -> Config:
        return self._config

    @property
    def policy(self) -> Policy:
        """The planner policy in force (read by the reconcile loop at every cycle)."""
        return self._policy

    def orphan_policy(self, provider: str) -> OrphanPolicy:
        """``provider``'s orphan policy in force, with the join deadline the planner uses for it (``KeyError``
        for a provider the running config does not have)."""
        return self._orphan[provider]

    def _derive(self, config: Config) -> tuple[Config, Policy, dict[str, OrphanPolicy]]:
        """Everything built from ``config`` (``ConfigError`` if a knob is invalid), before anything is switched."""
        policy = self._fixed_policy if self._fixed_policy is not None else policy_from_config(config)
        orphan = {
            p.name: attrs.evolve(policy_of(p), join_deadline=policy.of(p.name).join_deadline) for p in config.providers
        }
        return config, policy, orphan

    def reload(self, new: Config) -> ReloadResult:
        """Switch to the live part of ``new`` atomically; name what needs a restart and keep its running values
        (module docstring). Never raises for a config it cannot use: see the result's ``outcome``."""
        self.reloads += 1
        at = self._wall()
        plan = plan_reload(self._config, new)
        if plan.restart and not plan.live:
            result = ReloadResult("restart_needed", (), plan.restart, at=at)  # the running config stays, untouched
        elif not plan.live:
            # Nothing that matters changed; the new value may still carry a new ``source``.
            self._config = attrs.evolve(self._config, source=new.source)
            result = ReloadResult("unchanged", at=at)
        else:
            try:
                derived = self._derive(with_live(self._config, new))
            except ConfigError as exc:
                result = ReloadResult("failed", (), plan.restart, problems=tuple(exc.problems) or (str(exc),), at=at)
            else:
                old = self._config
                self._config, self._policy, self._orphan = derived
                result = ReloadResult("applied", plan.live, plan.restart, at=at, previous=old)
        self.last = result
        return result

    def refused(self, problems: list[str]) -> ReloadResult:
        """Record a reload refused before it could be planned (the new config did not load)."""
        self.reloads += 1
        self.last = ReloadResult("failed", problems=tuple(problems[:MAX_NAMED]), at=self._wall())
        return self.last

    def status(self) -> dict[str, Any]:
        """The ``reload`` section of the daemon's status: how many reloads, the last one's outcome, when, what it
        applied and what needs a restart."""
        last = self.last
        return {"reloads": self.reloads, "last": None if last is None else last.to_json()}


class ReloadWatcher(Protocol):
    """Who hears of each reload, given to the daemon at construction (``DaemonCore(reload_watcher=...)``):
    ``reloading()`` before the file is read, ``reloaded(result, config)`` after, with the config now in force
    (``provisionerd run``: systemd's RELOADING=1 / READY=1 and the log level)."""

    def reloading(self) -> None: ...

    def reloaded(self, result: ReloadResult, config: Config) -> None: ...


class NoReloadWatcher:
    """The watcher of a daemon no one watches (tests, the simulation)."""

    def reloading(self) -> None:
        pass

    def reloaded(self, result: ReloadResult, config: Config) -> None:
        pass
