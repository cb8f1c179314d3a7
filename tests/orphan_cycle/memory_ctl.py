"""The reference controller in this trio run, reached over in-memory streams (MockClock-friendly, no TLS), and a
daemon config pointing at it."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import trio
import trio.testing

from provisionerd.config.loader import Config
from provisionerd.domain.model import Role


class MemoryNet:
    """Addresses ``ctl0:7400``... mapped to the replicas of an in-process ``ControllerServer``."""

    def __init__(self, server, nursery: trio.Nursery, replicas: int) -> None:
        self.server = server
        self.nursery = nursery
        self.addresses = tuple(f"ctl{i}:7400" for i in range(replicas))
        self.down = False

    async def connect(self, address: str) -> trio.abc.Stream:
        if self.down or address not in self.addresses:
            await trio.sleep(0.5)
            raise OSError(f"cannot reach {address}")
        client, server_side = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.handle_stream, server_side, self.addresses.index(address), Role.PROVISIONER)
        return client

    def facts(self) -> list:
        return list(self.server.cluster.store.all_facts())

    def live_leases(self) -> list:
        return self.server.cluster.leases.live_leases(trio.current_time())


@contextlib.asynccontextmanager
async def memory_controller(tmp_path: Path, replicas: int = 1, ttl: float = 30.0) -> AsyncIterator[MemoryNet]:
    from refcontroller.cluster import Cluster
    from refcontroller.server import Timeouts, open_controller_server
    from refcontroller.store import FactStore

    store = FactStore.open(tmp_path / f"facts-{trio.current_time()}.sqlite")
    try:
        cluster = Cluster.open(store, replicas, ttl, 5.0, trio.current_time())
        cluster.replicas.addresses = [f"ctl{i}:7400" for i in range(replicas)]
        async with open_controller_server(cluster, timeouts=Timeouts(heartbeat=15.0)) as server:
            async with trio.open_nursery() as nursery:
                yield MemoryNet(server, nursery, replicas)
                nursery.cancel_scope.cancel()
    finally:
        store.close()


def daemon_config(tmp_path: Path, addresses, orphans: str = "", cluster: str = "clu") -> Config:
    """A config for provider ``sim`` (the TLS files are never loaded: tests inject the connector)."""
    text = textwrap.dedent(f"""
        cluster = "{cluster}"
        identity = "prov-1"
        [controller]
        addresses = {list(addresses)!r}
        heartbeat_interval = 1
        heartbeat_timeout = 3
        request_timeout = 5
        connect_timeout = 2
        backoff = {{initial = 0.2, max = 4, multiplier = 2, jitter = 0.5}}
        [tls]
        ca = "ca.pem"
        cert = "provisioner.pem"
        key = "provisioner.key"
        [[providers]]
        name = "sim"
        transport = "oneshot"
        path = "plugins/sim"
        [providers.orphans]
        {orphans}
    """).replace("'", '"')
    return Config.from_toml(text, base_dir=tmp_path)
