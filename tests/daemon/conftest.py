"""Shared helpers for the daemon's tests: run a coroutine on a MockClock, build a keeper on a fake controller."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper, LeaseTransport
from provisionerd.telemetry.events import EventLog


@pytest.fixture
def mock_run() -> Callable[[Callable[[], Awaitable[Any]]], Any]:
    """Run an async function on ``MockClock(autojump_threshold=0)``, starting at virtual time 0.

    A test that waits for something that never happens would otherwise jump the clock forever: it fails with
    ``trio.TooSlowError`` after ``limit`` virtual seconds instead.
    """

    def run(fn: Callable[[], Awaitable[Any]], limit: float = 100_000.0) -> Any:
        async def bounded() -> Any:
            with trio.fail_after(limit):
                return await fn()

        return trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))

    return run


@pytest.fixture
def make_keeper() -> Callable[..., LeaseKeeper]:
    def make(provider: str, transport: LeaseTransport, events: EventLog | None = None, **kwargs: Any) -> LeaseKeeper:
        return LeaseKeeper(
            provider,
            transport,
            margin=kwargs.pop("margin", 2.0),
            backoff=kwargs.pop("backoff", Backoff(initial=0.5, max=8.0, multiplier=2.0, jitter=0.5)),
            rng=random.Random(kwargs.pop("seed", 7)),
            events=events if events is not None else EventLog(),
            **kwargs,
        )

    return make


# --- the reference controller over in-memory streams (MockClock-friendly) ------------------------------------


class Partitionable(trio.abc.Stream):
    """A client-side stream whose traffic can be silently dropped in both directions (a network partition)."""

    def __init__(self, inner: trio.abc.Stream, net: MemoryNet) -> None:
        self.inner = inner
        self.net = net

    async def send_all(self, data) -> None:
        if not self.net.partitioned:
            await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        while True:
            data = await self.inner.receive_some(max_bytes)
            if not data or not self.net.partitioned:
                return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class MemoryNet:
    """Addresses ``ctl0:7400``... mapped to the replicas of an in-process ``ControllerServer``."""

    def __init__(self, server, nursery: trio.Nursery, replicas: int) -> None:
        self.server = server
        self.nursery = nursery
        self.addresses = tuple(f"ctl{i}:7400" for i in range(replicas))
        self.partitioned = False
        self.down: set[str] = set()
        self.connects: list[tuple[float, str]] = []

    async def connect(self, address: str) -> trio.abc.Stream:
        from provisionerd.domain.model import Role

        self.connects.append((trio.current_time(), address))
        if self.partitioned or address in self.down or address not in self.addresses:
            await trio.sleep(0.5)  # a connect that times out or is refused, quickly
            raise OSError(f"cannot reach {address}")
        client, server_side = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.handle_stream, server_side, self.addresses.index(address), Role.PROVISIONER)
        return Partitionable(client, self)

    def fail_over(self, target: int | None = None) -> int:
        cluster = self.server.cluster
        old = cluster.replicas.primary
        new = cluster.fail_over(trio.current_time(), target)
        self.server.disconnect_replica(old)
        return new


@pytest.fixture
def memory_controller(tmp_path):
    """``async with memory_controller(replicas=3, ttl=30, check_interval=5) as net:`` a reference controller in
    this trio run, reached through ``net.connect`` (in-memory streams, role given, no TLS)."""
    import contextlib

    from refcontroller.cluster import Cluster
    from refcontroller.server import Timeouts, open_controller_server
    from refcontroller.store import FactStore

    @contextlib.asynccontextmanager
    async def open_it(replicas: int = 3, ttl: float = 30.0, check_interval: float = 5.0, heartbeat: float = 15.0):
        store = FactStore.open(tmp_path / f"facts-{trio.current_time()}.sqlite")
        try:
            cluster = Cluster.open(store, replicas, ttl, check_interval, trio.current_time())
            net_addresses = [f"ctl{i}:7400" for i in range(replicas)]
            cluster.replicas.addresses = list(net_addresses)
            async with open_controller_server(cluster, timeouts=Timeouts(heartbeat=heartbeat)) as server:
                async with trio.open_nursery() as nursery:
                    yield MemoryNet(server, nursery, replicas)
                    nursery.cancel_scope.cancel()
        finally:
            store.close()

    return open_it
