"""The one builder of the daemon's pieces: every setting the daemon runs with, derived from the config in one place.

``build_pieces(config, ...)`` returns the :class:`Pieces`: the controller session, one lease keeper per served
provider, the mutation gate over them, the one current-config holder (``Pieces.current``,
``daemon.current_config.CurrentConfig``: the running config and the planner's policy, ``policy_from_config``,
switched together on a reload) and the executor with the settings that policy implies
(``executor_settings_from``), plus the two things made from those: the orphan cycles (``Pieces.orphan_cycles``,
each reading its orphan policy from the holder) and the ``Actor`` an admin's orphan action decides and acts with
(``Pieces.actor``).

Two callers, one way to build. ``DaemonCore`` builds its pieces here for every configured provider, as the
config's identity. ``provisionerd orphans adopt|return`` with no daemon listening (``daemon.orphan_direct``)
builds its own here for the one provider it acts on, as its own identity (``<identity>-orphans-admin``): the same
session, lease and retry settings, the same policy and executor settings, the same wiring, so the direct path
cannot drift from the daemon (it once ran an executor with default settings while the daemon's came from the
config).

The wiring, with no callback installed anywhere: each keeper is built with the amnesia guard as its ``judge`` (a
grant is judged before it is held; a halt lapses every lease) and reads the session's pulses (``rejoined``: a new
primary may not know our leases, so every lease is confirmed at once; ``lease_freed``: a waiting keeper asks again).
After any acquisition the view may lack what the previous holder committed (never pushed to us), so the grant's
reply asks for a resync (``ControllerOps.acquire``) and that provider is planned, classified or acted on only from a
view resynced after the grant (``session.synced_for``).

Every limit the config gives a provider is that provider's own (``policy_from_config``): one
:class:`provisionerd.planner.policy.ProviderPolicy` per provider (``join_deadline``, ``idle_time``, ``max_ttl``,
``provisioning_timeout``, ``max_machines``, ``step_limit``, ``capacity_backoff``, ``quota_pause``,
``unhealthy_backoff``/``unhealthy_backoff_max``), read by the planner for that provider's machines, intents and
offers only. The same values reach the other readers from here: the executor polls each provider's requests and
returns for its own ``provisioning_timeout`` (``executor_settings_from``), and each orphan cycle classifies with its
provider's ``join_deadline`` as the planner has it (``Pieces.orphan_cycles``). The global step limit is the sum of
the providers' (each provider's own binds first).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from provisionerd.config.loader import Config
from provisionerd.controller.amnesia_guard import AmnesiaGuard
from provisionerd.controller.joined_file import JoinedRefs
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.memory_file import joined_refs, memory_store
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import SessionSettings, StreamFactory
from provisionerd.daemon.current_config import CurrentConfig, policy_from_config, provider_policy
from provisionerd.daemon.orphan_admin import Actor
from provisionerd.execution.executor import Executor, ExecutorSettings
from provisionerd.execution.feedback import Feedback, open_feedback
from provisionerd.execution.gate import MutationGate
from provisionerd.execution.orphan_cycle import OrphanCycle
from provisionerd.execution.orphan_reads import SettleTracker, peek_session, read_keeper, read_session
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import ProviderClient
from provisionerd.provider.values import MachineLimits
from provisionerd.telemetry.events import EventLog

__all__ = [
    "Pieces",
    "build_pieces",
    "build_session",
    "executor_settings_from",
    "policy_from_config",  # defined in daemon.current_config (the holder derives the policy on every reload)
    "provider_policy",
]


def executor_settings_from(config: Config, policy: Policy) -> ExecutorSettings:
    """The executor's settings: the config's cluster and controllers, and each provider's requests and returns
    polled for as long as ``policy`` lets that provider's requests provision (its ``provisioning_timeout``)."""
    timeouts = {p.name: policy.of(p.name).provisioning_timeout for p in config.providers}
    longest = max(timeouts.values(), default=policy.provisioning_timeout)
    return ExecutorSettings(
        cluster=config.cluster,
        controllers=config.controller.addresses,
        provisioning_timeout=longest,
        return_timeout=longest,
        provider_timeouts=timeouts,
        machine_limits={p.name: MachineLimits(p.worker_orphan_timeout, p.max_ttl) for p in config.providers},
    )


def build_session(
    config: Config,
    connect: StreamFactory,
    events: EventLog,
    rng: random.Random,
    *,
    identity: str | None = None,
    serve: Sequence[str] | None = None,
    instance: str = "",
    guard: AmnesiaGuard | None = None,
    joined: JoinedRefs | None = None,
) -> ControllerSession:
    """The controller session with the config's controller settings, as ``identity`` (default: the config's)
    claiming ``serve`` (default: every configured provider). ``instance``: this start's ``Join.instance`` (empty:
    drawn from ``rng``)."""
    settings = SessionSettings.from_config(config)
    settings = attrs.evolve(
        settings,
        identity=settings.identity if identity is None else identity,
        providers=settings.providers if serve is None else tuple(serve),
        instance=instance,
    )
    return ControllerSession(settings, connect, events, rng, guard, joined)


@attrs.define(eq=False)
class Pieces:
    """What ``build_pieces`` built (see the module docstring). ``current`` is the one current-config holder
    (``daemon.current_config``): ``config`` and ``policy`` are read through it, so a reload (``provisionerd run``'s
    SIGHUP) switches every reader at once, or none."""

    current: CurrentConfig
    identity: str
    events: EventLog
    session: ControllerSession
    ops: ControllerOps
    keepers: dict[str, LeaseKeeper]
    gate: MutationGate
    providers: dict[str, ProviderClient]
    executor: Executor
    wall: Callable[[], float]  # the clock of cloud launch times (the orphan cycles and actions read it too)
    guard: AmnesiaGuard  # what the daemon remembers of the controller; halts every mutation on amnesia
    feedback: Feedback  # what provider calls meant for the planner: the executor and the feed send, the loop reads
    #: Each orphan cycle's settle window (``orphan_cycles`` fills it; a reload sets the new ``settle``).
    settle_trackers: dict[str, SettleTracker] = attrs.field(factory=dict)

    @property
    def config(self) -> Config:
        """The running config (``current.config``)."""
        return self.current.config

    @property
    def policy(self) -> Policy:
        """The planner policy in force (``current.policy``)."""
        return self.current.policy

    def orphan_cycles(self) -> dict[str, tuple[OrphanCycle, float]]:
        """One orphan cycle (and its interval) per configured provider that has a client and a keeper, each reading
        this session and that provider's keeper and acting only through the executor."""
        config, session = self.config, self.session
        cycles: dict[str, tuple[OrphanCycle, float]] = {}
        for provider in config.providers:
            if provider.name not in self.providers or provider.name not in self.keepers:
                continue
            tracker = SettleTracker(provider.orphans.settle)
            self.settle_trackers[provider.name] = tracker
            keeper = self.keepers[provider.name]
            cycle = OrphanCycle(
                cluster=config.cluster,
                identity=config.identity,
                provider=provider.name,
                # The join deadline the planner uses for this provider, whatever policy the pieces were given.
                policy=self.current.orphan_policy(provider.name),
                client=self.providers[provider.name],
                read_controller=functools.partial(read_session, session, tracker, provider.name),
                read_lease=functools.partial(read_keeper, keeper),
                executor=self.executor,
                events=self.events,
                wall_clock=self.wall,
                list_timeout=provider.timeouts.for_action("listMachines"),
                fleet_floor=provider.max_machines,
                peek=functools.partial(peek_session, session, provider.name),
            )
            cycles[provider.name] = (cycle, provider.orphans.interval)
        return cycles

    def actor(self, provider: str, *, via: str, witness: Mapping[str, Any] | None = None) -> Actor:
        """Who decides and acts on an admin's orphan action for ``provider``: these pieces' identity, client, lease
        and executor. The view must be resynced after the lease grant (``read_session`` with the provider); the
        admin's word overrides "settling", so no settle window is waited for."""
        keeper = self.keepers[provider]
        session = self.session
        return Actor(
            identity=self.identity,
            via=via,
            client=self.providers[provider],
            read_controller=lambda: read_session(session, SettleTracker(0.0), provider),
            read_lease=lambda: read_keeper(keeper),
            executor=self.executor,
            events=self.events,
            wall_clock=self.wall,
            witness={} if witness is None else dict(witness),
        )


def build_pieces(
    config: Config,
    *,
    connect: StreamFactory,
    events: EventLog,
    rng: random.Random,
    providers: Mapping[str, ProviderClient],
    serve: Sequence[str] | None = None,
    identity: str | None = None,
    instance: str = "",
    policy: Policy | None = None,
    executor_settings: ExecutorSettings | None = None,
    wall: Callable[[], float] = time.time,
) -> Pieces:
    """Build the pieces (see the module docstring) for the providers in ``serve`` (default: every configured
    one), as ``identity`` (default: the config's). ``providers``: the provider clients (``daemon.clients``
    builds them from the config; tests and the simulation inject fakes). ``policy`` and ``executor_settings``
    replace what the config gives (tests, the simulation); ``rng`` is drawn from in a fixed order (the session's
    instance, then the keepers' back-offs), so a seeded run repeats."""
    names = tuple(config.provider_names if serve is None else serve)
    guard = AmnesiaGuard(memory_store(config), events)  # raises StateFileDamaged for a state file not to trust
    session = build_session(
        config,
        connect,
        events,
        rng,
        identity=identity,
        serve=names,
        instance=instance,
        guard=guard,
        joined=joined_refs(config),  # raises StateFileDamaged for a file that cannot be read
    )
    ops = ControllerOps(session)
    # Each keeper reads what the session and the guard saw (pulses and state), and no one calls anyone back.
    keepers = {
        name: LeaseKeeper(
            name,
            ops,
            margin=config.lease.margin,
            backoff=config.controller.backoff,
            rng=rng,
            events=events,
            judge=guard,
            rejoined=session.rejoined,
            freed=session.lease_freed[name],
        )
        for name in names
    }
    gate = MutationGate(keepers, ops, events, halted=lambda: guard.halted)
    current = CurrentConfig(config, policy=policy, wall=wall)  # ConfigError for a knob it cannot build
    policy = current.policy
    settings = executor_settings if executor_settings is not None else executor_settings_from(config, policy)
    clients = dict(providers)

    def facts() -> FactView | None:  # the executor's read of the facts (None before the first resync)
        view = session.view
        return None if view is None else view.facts

    feedback = open_feedback()  # the executor's and the offer feed's observations, to the reconcile loop
    executor = Executor(settings, clients, gate, keepers, ops, events, facts=facts, wall=wall, feedback=feedback.send)
    return Pieces(
        current=current,
        identity=session.settings.identity,
        events=events,
        session=session,
        ops=ops,
        keepers=keepers,
        gate=gate,
        providers=clients,
        executor=executor,
        wall=wall,
        guard=guard,
        feedback=feedback,
    )
