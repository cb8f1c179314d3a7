"""The daemon core (``DaemonCore``) in the test's own process, over real plugins and a real controller: what
``provisionerd run`` runs, for tests that reach inside it (its session's state, its lease keepers, its events, a
recorder around a plugin's transport) on the real clock.

The config is the rig's (``rigs.daemon.daemon_config``); the executor polls quickly (first poll after 50 ms, at
most every 0.5 s) so a lifecycle takes seconds; the policy and the reconcile loop's timings are each test's own.
``running_core`` is the end-to-end form over a real back end (Slurm, Kubernetes): end-to-end timings (a request
may take two minutes to come up, an idle machine is returned after 1 s), the one provider's transport recorded, so
a test can also prove the join tokens handed to the plugin stay secret (``RunningCore.tokens``).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd.config.loader import Backoff, Config, ProviderConfig, ProviderTimeouts
from provisionerd.config.writer import write_daemon_config
from provisionerd.daemon.clients import provider_clients
from provisionerd.daemon.root import DaemonCore
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import PluginClient
from provisionerd.provider.persistent import PersistentProvider
from rigs.daemon import daemon_config

#: The executor's test timings (``ExecutorSettings``), each overridable through ``daemon_core``'s ``executor``.
EXECUTOR = {"poll_initial": 0.05, "poll_max": 0.5, "retry_delay": 0.1, "provisioning_timeout": 60.0}


class Recorder:
    """Wraps a provider's transport and records every call with (a copy of) its input, in order: what the daemon
    asked the plugin, for the test to check."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[str, Any]] = []

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.calls.append((action, copy.deepcopy(input)))
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def actions(self) -> list[str]:
        return [action for action, _ in self.calls]

    def inputs(self, action: str) -> list[Any]:
        return [input for called, input in self.calls if called == action]


def record(config: Config, provider: str) -> Recorder:
    """A recorder around the transport the daemon would build for ``provider`` (``daemon_core(recorded=...)``)."""
    return Recorder(provider_clients(config)[provider].transport)


def daemon_core(
    config: Config,
    *,
    policy: Policy,
    loop: LoopSettings,
    recorded: Recorder | None = None,
    offer_interval: float = 5.0,
    **executor: Any,
) -> DaemonCore:
    """The core for ``config``, over the providers it configures, or over the one ``recorded`` wraps alone.
    ``policy`` is the test's own; each provider's ``unverified_templates`` comes from ``config``
    (``rigs.daemon.as_records``) when ``policy`` has no entry of that provider."""
    settings = {**EXECUTOR, **executor}
    unverified = {
        p.name: attrs.evolve(policy.of(p.name), unverified_templates=p.unverified_templates)
        for p in config.providers
        if p.unverified_templates and p.name not in policy.providers
    }
    if unverified:  # a provider's cap moves into its own entry with it (Policy refuses it in both places)
        caps = {name: cap for name, cap in policy.provider_caps.items() if name not in unverified}
        policy = attrs.evolve(policy, providers={**policy.providers, **unverified}, provider_caps=caps)
    providers = None if recorded is None else {recorded.name: PluginClient(recorded)}
    return DaemonCore(
        config,
        providers=providers,
        policy=policy,
        offer_interval=offer_interval,
        loop_settings=loop,
        executor_settings=ExecutorSettings(
            cluster=config.cluster, controllers=tuple(config.controller.addresses), **settings
        ),
    )


@asynccontextmanager
async def running(core: DaemonCore, *transports: Any, release: float = 3.0) -> AsyncIterator[trio.Nursery]:
    """``core.run`` (after each persistent transport's ``run``) in a nursery, yielded for the test's own tasks; at
    the end the leases are given back while the link is still up (shielded, within ``release`` s), everything is
    cancelled and the events log closed."""
    async with trio.open_nursery() as nursery:
        for transport in transports:
            if isinstance(transport, PersistentProvider):
                await nursery.start(transport.run)
        await nursery.start(core.run)
        try:
            yield nursery
        finally:
            with trio.CancelScope(shield=True):
                await core.release_leases(release)
            nursery.cancel_scope.cancel()
    core.events.close()


#: The link of an end-to-end daemon: 10 s to connect, answer and miss heartbeats (a loaded 2-core machine running
#: a back end and agents), heartbeats every 0.5 s, back-offs of at most 0.5 s.
END_TO_END_LINK = dict(connect_timeout=10, request_timeout=10, heartbeat_timeout=10, backoff=Backoff(0.05, max=0.5))
#: A plugin call may take 40 s on a real back end.
END_TO_END_TIMEOUTS = ProviderTimeouts(default=40)


def end_to_end_config(
    home: Path, certs: Path, addresses: Sequence[str], provider: ProviderConfig, *, cluster: str, identity: str
) -> Config:
    """The daemon's config with ``END_TO_END_LINK``, its state in ``home``, written to ``home/pd.toml`` (for a CLI
    call that reads it) and read back."""
    config = daemon_config(certs, addresses, home, provider, cluster=cluster, identity=identity, link=END_TO_END_LINK)
    return write_daemon_config(config, home / "pd.toml")


@attrs.frozen
class RunningCore:
    core: DaemonCore
    recorder: Recorder

    @property
    def tokens(self) -> dict[str, str]:
        """The join tokens handed to the plugin so far (instanceRef -> token)."""
        return {
            boot["instanceRef"]: boot["joinToken"]
            for request in self.recorder.inputs("requestMachines")
            for boot in request["bootstrap"]
        }


@asynccontextmanager
async def running_core(
    config: Config, controllers: Sequence[str], caps: Mapping[str, int]
) -> AsyncIterator[RunningCore]:
    """``DaemonCore`` for ``config``'s one persistent provider (its transport recorded), with end-to-end timings:
    idle machines returned after 1 s, two minutes to join or to come up, at most ``caps`` machines a provider."""
    (provider,) = config.providers
    assert tuple(controllers) == tuple(config.controller.addresses), (controllers, config.controller.addresses)
    recorder = record(config, provider.name)
    assert isinstance(recorder.inner, PersistentProvider), recorder.inner
    policy = Policy(
        cluster=config.cluster,
        idle_time=1.0,
        join_deadline=120.0,
        provisioning_timeout=120.0,
        capacity_backoff=60.0,
        provider_caps=dict(caps),
    )
    core = daemon_core(
        config,
        policy=policy,
        loop=LoopSettings(replan_interval=0.5, reclaim_interval=5.0, recover_after=10.0),
        recorded=recorder,
        offer_interval=10.0,
        poll_initial=0.2,
        poll_max=1.0,
        retry_delay=0.2,
        provisioning_timeout=120.0,
        return_timeout=120.0,
    )
    async with running(core, recorder.inner):
        yield RunningCore(core, recorder)
