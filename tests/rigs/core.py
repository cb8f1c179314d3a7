"""The daemon's core (``DaemonCore``) in the test's own trio run, over the real provider plugins, against a
reference controller in the same run (``refcontroller.api.open_refcontroller``): the whole daemon but its process,
so that a test can also watch what it hands its plugins (the join tokens, which must stay secret).

``running_core`` starts it with end-to-end timings (a request may take two minutes to come up on a real back end,
an idle machine is returned after 1 s) and stops it the way a daemon stops: leases released while the link is
still up, then its tasks cancelled and its events log closed.
"""

from __future__ import annotations

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


class RecordingTransport:
    """Wraps a provider transport and keeps the join tokens the daemon hands the plugin (instanceRef -> token), so
    a test can prove they stay secret. It changes nothing in the calls."""

    def __init__(self, inner: PersistentProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.tokens: dict[str, str] = {}

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
        if action == "requestMachines":
            for boot in input["bootstrap"]:
                self.tokens[boot["instanceRef"]] = boot["joinToken"]
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.frozen
class RunningCore:
    core: DaemonCore
    transport: RecordingTransport

    @property
    def tokens(self) -> dict[str, str]:
        """The join tokens handed to the plugin so far (instanceRef -> token)."""
        return self.transport.tokens


@asynccontextmanager
async def running_core(
    config: Config, controllers: Sequence[str], caps: Mapping[str, int]
) -> AsyncIterator[RunningCore]:
    """``DaemonCore`` for ``config``'s one persistent provider (its transport recorded), with end-to-end timings:
    idle machines returned after 1 s, two minutes to join or to come up, at most ``caps`` machines a provider."""
    (provider,) = config.providers
    client = provider_clients(config)[provider.name].transport
    assert isinstance(client, PersistentProvider), client
    recorder = RecordingTransport(client)
    policy = Policy(
        cluster=config.cluster,
        idle_time=1.0,
        join_deadline=120.0,
        provisioning_timeout=120.0,
        capacity_backoff=60.0,
        provider_caps=dict(caps),
    )
    core = DaemonCore(
        config,
        providers={provider.name: PluginClient(recorder)},
        policy=policy,
        offer_interval=10.0,
        loop_settings=LoopSettings(replan_interval=0.5, reclaim_interval=5.0, recover_after=10.0),
        executor_settings=ExecutorSettings(
            cluster=config.cluster,
            controllers=tuple(controllers),
            poll_initial=0.2,
            poll_max=1.0,
            retry_delay=0.2,
            provisioning_timeout=120.0,
            return_timeout=120.0,
        ),
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)  # wrapped, so the core does not start it
            await nursery.start(core.run)
            try:
                yield RunningCore(core, recorder)
            finally:
                with trio.CancelScope(shield=True):
                    await core.release_leases()
                nursery.cancel_scope.cancel()
    finally:
        core.events.close()


def facts_of(ctl: Any, kind: type) -> list[Any]:
    """The facts of ``kind`` in the log of an in-process controller (``open_refcontroller``)."""
    assert ctl.server is not None
    return [c.fact for c in ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]
