"""The reference controller in the test's own trio run, reached over in-memory streams, and a daemon config for it.

For tests of the daemon's parts on ``MockClock``: no TLS (the server is told each connection's role), no sockets,
so virtual time runs as fast as the scheduler can. ``MemoryNet.connect`` is the daemon's stream factory; the test
can partition the network, take an address down, fail the primary over, and read the store and the lease table.

``memory_config`` is ``rigs.daemon.daemon_config`` with the timings these tests were written against (heartbeats
every second, a 3 s heartbeat timeout, the default lease margin) and no events log or admin socket: the daemon's
core runs in the test, which passes its own ``EventLog``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from provisionerd.config.loader import (
    Backoff,
    Config,
    DaemonSettings,
    LeaseSettings,
    OrphanSettings,
    ProviderConfig,
)
from provisionerd.domain.model import Role
from rigs.daemon import daemon_config

#: The controller link's timings of the in-memory tests (``rigs.daemon.link_settings`` overrides).
MEMORY_LINK: Mapping[str, Any] = {
    "connect_timeout": 2.0,
    "request_timeout": 5.0,
    "heartbeat_interval": 1.0,
    "heartbeat_timeout": 3.0,
    "backoff": Backoff(initial=0.2, max=4.0),
}


class Partitionable(trio.abc.Stream):
    """A client-side stream whose traffic is silently dropped, both ways, while the net is partitioned."""

    def __init__(self, inner: trio.abc.Stream, net: MemoryNet) -> None:
        self.inner = inner
        self.net = net

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self.net.partitioned:
            await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        while True:
            data = await self.inner.receive_some(max_bytes)
            if not data or not self.net.partitioned:
                return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class MemoryNet:
    """Addresses ``ctl0:7400``... mapped to the replicas of an in-process ``ControllerServer``.

    A connect to an address that is down (``down`` holds it, or ``partitioned`` is set) fails after 0.5 s, as a
    refused or timed-out connect would; every attempt is noted in ``connects`` with its time."""

    def __init__(self, server: Any, nursery: trio.Nursery, replicas: int) -> None:
        self.server = server
        self.nursery = nursery
        self.addresses = tuple(f"ctl{i}:7400" for i in range(replicas))
        self.partitioned = False
        self.down: set[str] = set()
        self.connects: list[tuple[float, str]] = []

    async def connect(self, address: str) -> trio.abc.Stream:
        self.connects.append((trio.current_time(), address))
        if self.partitioned or address in self.down or address not in self.addresses:
            await trio.sleep(0.5)
            raise OSError(f"cannot reach {address}")
        client, server_side = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.handle_stream, server_side, self.addresses.index(address), Role.PROVISIONER)
        return Partitionable(client, self)

    def fail_over(self, target: int | None = None) -> int:
        """Promote another replica (``target`` or the cluster's choice) and cut the old primary's connections."""
        cluster = self.server.cluster
        old = cluster.replicas.primary
        new = cluster.fail_over(trio.current_time(), target)
        self.server.disconnect_replica(old)
        return int(new)

    def facts(self) -> list[Any]:
        return list(self.server.cluster.store.all_facts())

    def live_leases(self) -> list[Any]:
        return list(self.server.cluster.leases.live_leases(trio.current_time()))


@contextlib.asynccontextmanager
async def open_memory_controller(
    home: Path, replicas: int = 3, ttl: float = 30.0, check_interval: float = 5.0, heartbeat: float = 15.0
) -> AsyncIterator[MemoryNet]:
    """A reference controller promoted at the current (virtual) time, its store a fresh file in ``home``."""
    from refcontroller.cluster import Cluster
    from refcontroller.server import Timeouts, open_controller_server
    from refcontroller.store import FactStore

    store = FactStore.open(home / f"facts-{trio.current_time()}.sqlite")
    try:
        cluster = Cluster.open(store, replicas, ttl, check_interval, trio.current_time())
        cluster.replicas.addresses = [f"ctl{i}:7400" for i in range(replicas)]
        async with open_controller_server(cluster, timeouts=Timeouts(heartbeat=heartbeat)) as server:
            async with trio.open_nursery() as nursery:
                yield MemoryNet(server, nursery, replicas)
                nursery.cancel_scope.cancel()
    finally:
        store.close()


def sim_provider(home: Path, orphans: Mapping[str, Any] | None = None, **options: Any) -> ProviderConfig:
    """Provider ``sim`` at ``home/plugins/sim``, never run (the test injects its client); ``orphans`` are its
    ``[providers.orphans]`` settings, ``options`` the rest of its table."""
    return ProviderConfig(
        "sim", "oneshot", path=home / "plugins" / "sim", orphans=OrphanSettings(**(orphans or {})), **options
    )


def memory_config(
    home: Path,
    addresses: Sequence[str],
    *providers: ProviderConfig,
    identity: str = "prov-1",
    cluster: str = "clu",
    orphans: Mapping[str, Any] | None = None,
    link: Mapping[str, Any] | None = None,
    **daemon: Any,
) -> Config:
    """A daemon config for ``MemoryNet`` addresses: ``providers``, or ``sim_provider(home, orphans)``; TLS paths
    that are never loaded; ``link`` overrides ``MEMORY_LINK``; ``daemon`` sets the ``[daemon]`` table (empty by
    default)."""
    providers = providers or (sim_provider(home, orphans),)
    config = daemon_config(
        home / "certs",
        addresses,
        home,
        *providers,
        cluster=cluster,
        identity=identity,
        margin=LeaseSettings().margin,
        link={**MEMORY_LINK, **(link or {})},
    )
    return attrs.evolve(config, daemon=DaemonSettings(**daemon))


def memory_core(net: MemoryNet, config: Config, *providers: Any, **options: Any) -> Any:
    """The daemon's ``DaemonCore`` on ``net``, serving each in-memory provider (a ``FakeProvider``, under its own
    name) through a ``PluginClient``; ``options`` are ``DaemonCore``'s (``events``, ``wall``, ``offer_interval``)."""
    from provisionerd.daemon.root import DaemonCore
    from provisionerd.provider.client import PluginClient

    clients = {provider.name: PluginClient(provider) for provider in providers}
    return DaemonCore(config, connect=net.connect, providers=clients, **options)


@contextlib.asynccontextmanager
async def running(core: Any) -> AsyncIterator[trio.Nursery]:
    """``core.run`` started (its ``task_status`` reached) in a nursery that is cancelled when the block ends."""
    async with trio.open_nursery() as nursery:
        await nursery.start(core.run)
        yield nursery
        nursery.cancel_scope.cancel()


def memory_session_settings(
    addresses: Sequence[str], identity: str = "prov-a", providers: Sequence[str] = ("sim",), **options: Any
) -> Any:
    """The controller session's settings with ``MEMORY_LINK``'s timings, for tests that wire a session (and its
    keepers) themselves; ``options`` are ``SessionSettings``' others (``refresh_heartbeats``)."""
    from provisionerd.controller.session_settings import SessionSettings

    return SessionSettings(
        identity=identity, providers=tuple(providers), addresses=tuple(addresses), **MEMORY_LINK, **options
    )
