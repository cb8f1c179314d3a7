"""The one builder of the daemon's pieces: every setting the daemon runs with, derived from the config in one place.

``build_pieces(config, ...)`` returns the :class:`Pieces`: the controller session, one lease keeper per served
provider, the mutation gate over them, the planner's policy (``policy_from_config``) and the executor with the
settings that policy implies (``executor_settings_from``), plus the two things made from those: the orphan cycles
(``Pieces.orphan_cycles``) and the ``Actor`` an admin's orphan action decides and acts with (``Pieces.actor``).

Two callers, one way to build. ``DaemonCore`` builds its pieces here for every configured provider, as the
config's identity. ``provisionerd orphans adopt|return`` with no daemon listening (``daemon.orphan_direct``)
builds its own here for the one provider it acts on, as its own identity (``<identity>-orphans-admin``): the same
session, lease and retry settings, the same policy and executor settings, the same hooks, so the direct path
cannot drift from the daemon (it once ran an executor with default settings while the daemon's came from the
config).

The hooks every build installs: after any acquisition the view may lack what the previous holder committed
(never pushed to us), so a grant asks for a resync and that provider is planned, classified or acted on only from
a view resynced after the grant (``session.synced_for``); and a resync (a new primary may not know our leases)
confirms every lease at once instead of at the next scheduled renewal.

The planner's policy is global while the config's limits are per provider (``policy_from_config``): each
provider's ``max_machines`` is its cap, the step limit is the sum of the providers' step limits, ``join_deadline``,
``idle_time`` and ``provisioning_timeout`` take the largest configured value (never return a machine or fail a
request earlier than any provider allows) and ``max_ttl`` the smallest non-zero one.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from provisionerd.config.loader import Config
from provisionerd.controller.amnesia import Amnesia
from provisionerd.controller.amnesia_guard import AmnesiaGuard
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.memory_file import memory_store
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession, SessionSettings, StreamFactory
from provisionerd.controller.view import ControllerView
from provisionerd.daemon.orphan_admin import Actor, policy_of
from provisionerd.domain.model import Epoch
from provisionerd.execution.executor import Executor, ExecutorSettings
from provisionerd.execution.gate import MutationGate
from provisionerd.execution.orphan_cycle import OrphanCycle
from provisionerd.execution.orphan_reads import SettleTracker, read_keeper, read_session
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import ProviderClient
from provisionerd.telemetry.events import EventLog


def policy_from_config(config: Config) -> Policy:
    """The planner's policy for all of ``config``'s providers (see the module docstring)."""
    providers = config.providers
    ttls = [p.max_ttl for p in providers if p.max_ttl > 0]
    return Policy(
        cluster=config.cluster,
        join_deadline=max(p.join_deadline for p in providers),
        provisioning_timeout=max(p.provisioning_timeout for p in providers),
        idle_time=max(max(p.idle_time for p in providers), 0.001),
        max_ttl=min(ttls) if ttls else None,
        step_limit=sum(p.step_limit for p in providers),
        provider_caps={p.name: p.max_machines for p in providers},
    )


def executor_settings_from(config: Config, policy: Policy) -> ExecutorSettings:
    """The executor's settings: the config's cluster and controllers, and requests and returns polled for as long
    as ``policy`` lets a request provision (the configured ``provisioning_timeout``)."""
    return ExecutorSettings(
        cluster=config.cluster,
        controllers=config.controller.addresses,
        provisioning_timeout=policy.provisioning_timeout,
        return_timeout=policy.provisioning_timeout,
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
    return ControllerSession(settings, connect, events, rng, guard)


@attrs.define(eq=False)
class Pieces:
    """What ``build_pieces`` built (see the module docstring). ``config`` is the one the pieces were built from; the
    daemon replaces it on a reload (``provisionerd run``'s SIGHUP), and the orphan actions read it at each request."""

    config: Config
    identity: str
    events: EventLog
    session: ControllerSession
    ops: ControllerOps
    keepers: dict[str, LeaseKeeper]
    gate: MutationGate
    providers: dict[str, ProviderClient]
    policy: Policy
    executor: Executor
    wall: Callable[[], float]  # the clock of cloud launch times (the orphan cycles and actions read it too)
    guard: AmnesiaGuard  # what the daemon remembers of the controller; halts every mutation on amnesia

    def orphan_cycles(self) -> dict[str, tuple[OrphanCycle, float]]:
        """One orphan cycle (and its interval) per configured provider that has a client and a keeper, each reading
        this session and that provider's keeper and acting only through the executor."""
        config, session = self.config, self.session
        cycles: dict[str, tuple[OrphanCycle, float]] = {}
        for provider in config.providers:
            if provider.name not in self.providers or provider.name not in self.keepers:
                continue
            tracker = SettleTracker(provider.orphans.settle)
            session.on_resync.append(functools.partial(_joined, tracker))
            keeper = self.keepers[provider.name]
            cycle = OrphanCycle(
                cluster=config.cluster,
                identity=config.identity,
                provider=provider.name,
                policy=policy_of(provider),
                client=self.providers[provider.name],
                read_controller=functools.partial(read_session, session, tracker, provider.name),
                read_lease=functools.partial(read_keeper, keeper),
                executor=self.executor,
                events=self.events,
                wall_clock=self.wall,
                list_timeout=provider.timeouts.for_action("listMachines"),
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
        config, connect, events, rng, identity=identity, serve=names, instance=instance, guard=guard
    )
    ops = ControllerOps(session)
    keepers = {
        name: LeaseKeeper(
            name, ops, margin=config.lease.margin, backoff=config.controller.backoff, rng=rng, events=events
        )
        for name in names
    }
    gate = MutationGate(keepers, ops, events, halted=lambda: guard.halted)
    policy = policy if policy is not None else policy_from_config(config)
    settings = executor_settings if executor_settings is not None else executor_settings_from(config, policy)
    clients = dict(providers)

    def facts() -> FactView | None:  # the executor's read of the facts (None before the first resync)
        view = session.view
        return None if view is None else view.facts

    executor = Executor(settings, clients, gate, keepers, ops, events, facts=facts, wall=wall)
    for name, keeper in keepers.items():
        keeper.on_acquired.append(functools.partial(_resync_after_grant, session, name))
        keeper.grant_checks.append(guard.check_grant)
        keeper.on_acquired.append(functools.partial(guard.note_granted, name))
        guard.on_halt.append(functools.partial(_halt_keeper, keeper))
    guard.on_halt.append(functools.partial(_halt_session, session))
    session.on_resync.append(functools.partial(_renew_all, keepers))
    return Pieces(
        config=config,
        identity=session.settings.identity,
        events=events,
        session=session,
        ops=ops,
        keepers=keepers,
        gate=gate,
        providers=clients,
        policy=policy,
        executor=executor,
        wall=wall,
        guard=guard,
    )


# The hooks, as functions: a lambda in a loop would need default arguments to bind its loop variables.


def _joined(tracker: SettleTracker, view: ControllerView) -> None:
    tracker.joined(view.generation)


def _resync_after_grant(session: ControllerSession, provider: str, _epoch: Epoch) -> None:
    session.resync_after_grant(provider)


def _halt_keeper(keeper: LeaseKeeper, finding: Amnesia) -> None:
    keeper.halt(f"controller amnesia: {finding.reason}")


def _halt_session(session: ControllerSession, finding: Amnesia) -> None:
    session.break_link(f"controller amnesia: {finding.detail}")


def _renew_all(keepers: Mapping[str, LeaseKeeper], _view: ControllerView) -> None:
    for keeper in keepers.values():
        keeper.renew_now()
