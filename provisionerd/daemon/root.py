"""The daemon's controller side wired together: session, lease keepers, mutation gate, admin socket, events.

``DaemonCore(config)`` builds the pieces; ``await nursery.start(core.run)`` runs them until cancelled; then
``await core.release_leases()`` gives every lease back (SIGTERM path).

The provisioning side: one provider client per configured provider (``provider_clients``; persistent plugins are
supervised in ``run``), the offer feed, the executor (every mutation through ``core.gate``) and the reconcile loop,
which reads ``core.session.view``. Tests may inject ``providers`` (e.g. in-memory fakes), a ``policy`` and the
loop/executor settings.

The planner's policy is global while the config's limits are per provider (``policy_from_config``): each
provider's ``max_machines`` is its cap, the step limit is the sum of the providers' step limits, ``join_deadline``,
``idle_time`` and ``provisioning_timeout`` take the largest configured value (never return a machine or fail a
request earlier than any provider allows) and ``max_ttl`` the smallest non-zero one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from provisionerd.config.loader import ACTION_TIMEOUT_KEYS, Config, ProviderConfig
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession, SessionSettings, StreamFactory
from provisionerd.daemon.admin_socket import serve_admin_socket
from provisionerd.daemon.orphans import OrphanActions, run_orphan_cycles
from provisionerd.execution.executor import Executor, ExecutorSettings
from provisionerd.execution.gate import MutationGate
from provisionerd.execution.loop import LoopSettings, ReconcileLoop
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.policy import Policy
from provisionerd.provider import runtime
from provisionerd.provider.legacy.wiring import client_for, legacy_settings
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.persistent import PersistentProvider
from provisionerd.telemetry.events import EventLog


def runtime_config(config: Config, provider: ProviderConfig) -> runtime.ProviderConfig:
    """The plugin runtime's view of one configured provider (its ``env`` values are credentials: redacted)."""
    if provider.transport == "persistent":
        command = provider.command
        path = command[0] if command else ""
        if not provider.argv and provider.path is not None and provider.path.is_dir():
            path = str(provider.path / "provider")
        args = tuple(command[1:])
    else:
        path, args = str(provider.path or ""), ()
    return runtime.ProviderConfig(
        name=provider.name,
        cluster=config.cluster,
        path=path,
        transport=provider.transport,
        args=args,
        conf_dir=str(provider.conf_dir or ""),
        data_dir=str(provider.data_dir or ""),
        credentials=dict(provider.env),
        timeouts={action: provider.timeouts.for_action(action) for action in ACTION_TIMEOUT_KEYS},
    )


def provider_client(config: Config, provider: ProviderConfig) -> Any:
    """The ``ProviderClient`` of one configured provider. A one-shot plugin runs through the legacy LSF adapter
    when ``[providers.legacy] mode`` is ``true``, or ``"auto"`` (the default) and its directory lacks our
    extension scripts (``describeProvider.sh``/``listMachines.sh``); ``false`` never. ``ConfigError`` for bad
    legacy settings."""
    rc = runtime_config(config, provider)
    if provider.transport == "persistent":
        return PersistentProvider(rc)
    runner = OneShotProvider(rc)
    mode = provider.legacy.mode
    if mode == "off":
        return runner
    settings = legacy_settings(provider.legacy.settings_table(), f"providers[{provider.name}].legacy")
    return client_for(runner, settings, force=mode == "on")


def provider_clients(config: Config) -> dict[str, Any]:
    """One ``ProviderClient`` per configured provider (persistent ones must be ``run`` in a nursery)."""
    return {provider.name: provider_client(config, provider) for provider in config.providers}


def policy_from_config(config: Config) -> Policy:
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


class DaemonCore:
    def __init__(
        self,
        config: Config,
        *,
        connect: StreamFactory | None = None,
        events: EventLog | None = None,
        rng: random.Random | None = None,
        providers: Mapping[str, Any] | None = None,
        policy: Policy | None = None,
        loop_settings: LoopSettings = LoopSettings(),
        executor_settings: ExecutorSettings | None = None,
        offer_interval: float = 60.0,
        wall: Callable[[], float] = time.time,
        instance: str = "",
    ) -> None:
        """``instance``: this start's ``Join.instance`` (empty: drawn from ``rng``; the simulation names its own,
        so that adding the field did not shift the draws every seeded run makes from ``rng``)."""
        if connect is None:
            from provisionerd.controller.connect import (
                tls_connector,
            )  # loads the TLS files now: a bad path fails at start

            connect = tls_connector(config)
        self.config = config
        self.events = events if events is not None else EventLog(config.daemon.events_log)
        rng = rng if rng is not None else random.Random()
        session_settings = attrs.evolve(SessionSettings.from_config(config), instance=instance)
        self.session = ControllerSession(session_settings, connect, self.events, rng)
        self.ops = ControllerOps(self.session)
        self.keepers = {
            p.name: LeaseKeeper(
                p.name,
                self.ops,
                margin=config.lease.margin,
                backoff=config.controller.backoff,
                rng=rng,
                events=self.events,
            )
            for p in config.providers
        }
        self.gate = MutationGate(self.keepers, self.ops, self.events)
        self._keepers_nursery: trio.Nursery | None = None
        self.providers = dict(providers) if providers is not None else provider_clients(config)
        self.policy = policy if policy is not None else policy_from_config(config)
        self.feed = OfferFeed(self.providers, self.events, interval=offer_interval)
        if executor_settings is None:
            executor_settings = ExecutorSettings(
                cluster=config.cluster,
                controllers=config.controller.addresses,
                provisioning_timeout=self.policy.provisioning_timeout,
                return_timeout=self.policy.provisioning_timeout,
            )
        self.executor = Executor(
            executor_settings,
            self.providers,
            self.gate,
            self.keepers,
            self.ops,
            self.events,
            facts=self._facts,
            wall=wall,
        )
        self.wall = wall  # the clock of cloud launch times (the orphan cycles read it too)
        self.loop = ReconcileLoop(
            self.session,
            self.keepers,
            self.executor,
            self.feed,
            self.policy,
            self.events,
            settings=loop_settings,
            wall=wall,
            jitter_seed=rng.randrange(1 << 30),
            view_ready=self.session.synced_for,
        )
        # After any acquisition the view may lack what the previous holder committed (never pushed to us): resync,
        # and plan that provider only from a view resynced after the grant (``session.synced_for``).
        for name, keeper in self.keepers.items():
            keeper.on_acquired.append(lambda _epoch, name=name: self.session.resync_after_grant(name))
        # A new primary may not know our leases: confirm them at once instead of at the next scheduled renewal.
        self.session.on_resync.append(lambda _view: [k.renew_now() for k in self.keepers.values()])
        # ``provisionerd orphans adopt|return`` through the admin socket: decided and done with our own pieces.
        self.orphan_actions = OrphanActions(self)

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        leases = []
        for keeper in self.keepers.values():
            s = keeper.status(now)
            leases.append(
                {
                    "provider": s.provider,
                    "state": s.state.value,
                    "epoch": str(s.epoch) if s.epoch else None,
                    "remaining": None if s.remaining is None else round(s.remaining, 3),
                    "reason": s.reason,
                }
            )
        return {
            "cluster": self.config.cluster,
            "identity": self.config.identity,
            "link": self.session.status(),
            "leases": leases,
            "reconcile": {
                "cycles": self.loop.cycles,
                "busy_ops": len(self.executor.busy_ops),
                "offers": len(self.feed.catalog),
            },
        }

    def _facts(self) -> FactView | None:
        view = self.session.view
        return None if view is None else view.facts

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. For a clean stop call ``release_leases`` first, while the link is still up."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.orphan_actions.run)
            if self.config.daemon.admin_socket is not None:
                await nursery.start(
                    serve_admin_socket,
                    self.config.daemon.admin_socket,
                    self.status,
                    {"orphan_action": self.orphan_actions.command},
                )
            await nursery.start(self.session.run)
            self._keepers_nursery = await nursery.start(self._run_keepers)
            for client in self.providers.values():
                if isinstance(client, PersistentProvider):
                    await nursery.start(client.run)
            await nursery.start(self.feed.run)
            await nursery.start(self.loop.run)
            # Orphan cycles (provisionerd.orphan_daemon): one per provider, every action through the executor.
            self.orphan_cycles = await nursery.start(run_orphan_cycles, self, self.providers, self.executor)
            self.events.emit("daemon_started", identity=self.config.identity, providers=list(self.keepers))
            task_status.started()

    async def _run_keepers(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        async with trio.open_nursery() as nursery:
            for keeper in self.keepers.values():
                await nursery.start(keeper.run)
            task_status.started(nursery)

    async def release_leases(self, timeout: float = 3.0) -> None:
        """Stop the keepers (no more renewals or acquisitions), then stop all mutations and give every held lease
        back, concurrently, bounded by ``timeout``. Call it before cancelling ``run`` so the link is still up."""
        if self._keepers_nursery is not None:
            self._keepers_nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            for keeper in self.keepers.values():
                nursery.start_soon(keeper.release, timeout)
