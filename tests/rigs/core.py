"""The daemon core (``DaemonCore``) in the test's own process, over real plugins and a real controller: what
``provisionerd run`` runs, for tests that reach inside it (its session's state, its lease keepers, its events, a
recorder around a plugin's transport) on the real clock.

The config is the rig's (``rigs.daemon.daemon_config``); the executor polls quickly (first poll after 50 ms, at
most every 0.5 s) so a lifecycle takes seconds; the policy and the reconcile loop's timings are each test's own.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from provisionerd.config.loader import Config
from provisionerd.daemon.clients import provider_clients
from provisionerd.daemon.root import DaemonCore
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import PluginClient
from provisionerd.provider.persistent import PersistentProvider

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
    """The core for ``config``, over the providers it configures, or over the one ``recorded`` wraps alone."""
    settings = {**EXECUTOR, **executor}
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
