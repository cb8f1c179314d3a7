"""Resyncs after the join: a lost demand snapshot is asked for again, a lost change push heals at the periodic
refresh, and a lease grant is planned from only once a resync sent after it is in (reference controller over
in-memory streams, MockClock)."""

from __future__ import annotations

import functools
import random
from itertools import pairwise

import trio
import trio.testing
from rigs.memory import memory_session_settings, running

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import LinkState
from provisionerd.domain.model import NO_EPOCH, DemandItem, RequestIntent, ResourceShape, Role
from provisionerd.execution.gate import MutationGate
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.simulation.network import _without_pushes

ITEM = DemandItem(demand_id="d1", shape=ResourceShape(ncpus=4), count=3)


class DropPushes(trio.abc.Stream):
    """The controller's end of a connection; while ``net.drop`` is set its pushes (``corr == 0``) are lost."""

    def __init__(self, inner: trio.abc.Stream, net: Net) -> None:
        self.inner, self.net = inner, net

    async def send_all(self, data) -> None:
        if self.net.drop:
            data = _without_pushes(bytes(data))
            if not data:
                return
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Net:
    def __init__(self, net) -> None:
        self.net, self.drop = net, False

    async def connect(self, address: str) -> trio.abc.Stream:
        client, server_side = trio.testing.memory_stream_pair()
        self.net.nursery.start_soon(
            self.net.server.handle_stream,
            DropPushes(server_side, self),
            self.net.addresses.index(address),
            Role.PROVISIONER,
        )
        return client


class WatchedEventLog(EventLog):
    """An events log that also hands each record to ``watch`` (the test's observer; set before the run)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.watchers: list = []

    def emit(self, event: str, **fields):
        record = super().emit(event, **fields)
        for watch in self.watchers:
            watch(record)
        return record


class Daemon:
    """Session, keeper and gate as ``DaemonCore`` builds them (a grant's reply asks for a resync: ``ControllerOps``)."""

    def __init__(self, net: Net, identity: str = "prov-a", refresh_heartbeats: int = 30, seed: int = 1) -> None:
        self.events = WatchedEventLog(keep=10_000)
        rng = random.Random(seed)
        settings = memory_session_settings(net.net.addresses, identity, refresh_heartbeats=refresh_heartbeats)
        self.session = ControllerSession(settings, net.connect, self.events, rng)
        self.ops = ControllerOps(self.session)
        self.keeper = LeaseKeeper(
            "sim", self.ops, margin=2.0, backoff=Backoff(initial=0.2, max=4.0), rng=rng, events=self.events
        )
        self.gate = MutationGate({"sim": self.keeper}, self.ops, self.events)

    async def run(self, *, lease: bool = True, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.session.run)
            if lease:
                await nursery.start(self.keeper.run)
            task_status.started()

    def refreshes(self) -> list[tuple[float, str]]:
        return [(e["mono"], e["reason"]) for e in self.events.recent if e["event"] == "refresh"]


async def wait_for(predicate, limit: float = 300.0) -> float:
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - waits on any predicate over the system under test, which has no event for it
            await trio.sleep(0.01)
    return trio.current_time()


def test_a_lost_snapshot_after_the_join_is_asked_for_again_with_backoff(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller() as mem:
            net = Net(mem)
            mem.server.cluster.set_demand([ITEM])
            net.drop = True
            daemon = Daemon(net, refresh_heartbeats=0)  # no periodic refresh: the missing snapshot alone asks
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(daemon.run, lease=False))
                await wait_for(lambda: daemon.session.state is LinkState.UP)
                await wait_for(lambda: len(daemon.refreshes()) >= 3)
                seen["incomplete"] = daemon.session.view.complete
                net.drop = False
                healed = await wait_for(lambda: daemon.session.view.complete)
                seen["late"] = healed - daemon.refreshes()[-1][0]
                seen["refreshes"] = daemon.refreshes()
                seen["items"] = daemon.session.view.demand.items
                seen["generation"] = daemon.session.generation
                nursery.cancel_scope.cancel()

    mock_run(main)
    assert seen["incomplete"] is False
    assert seen["items"] == (ITEM,) and seen["generation"] == 1  # healed on the same link, no rejoin
    times = [t for t, _ in seen["refreshes"]]
    assert all(reason == "no_demand_snapshot" for _, reason in seen["refreshes"]), seen["refreshes"]
    gaps = [b - a for a, b in pairwise(times)]
    assert all(later > earlier * 1.5 for earlier, later in pairwise(gaps)), (gaps, seen["refreshes"])  # backs off
    assert seen["late"] < 1.0  # the snapshot came with the next resync after the heal


def test_a_lost_demand_change_heals_at_the_digest(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller() as mem:
            net = Net(mem)
            mem.server.cluster.set_demand([ITEM])
            daemon = Daemon(net, refresh_heartbeats=20)
            async with running(daemon):
                await wait_for(lambda: daemon.session.view is not None and daemon.session.view.complete)
                net.drop = True
                changed = trio.current_time()
                mem.server.cluster.set_demand([ITEM, DemandItem("d2", ResourceShape(ncpus=1), 1)])
                mem.server.broadcast_demand()
                await trio.sleep(5)
                seen["stale"] = len(daemon.session.view.demand.items)
                net.drop = False  # nothing pushes the change again: only the refresh brings it
                healed = await wait_for(lambda: len(daemon.session.view.demand.items) == 2)
                seen["after"] = healed - changed
                seen["reasons"] = {reason for _, reason in daemon.refreshes()}

    mock_run(main)
    assert seen["stale"] == 1
    # The heartbeat digest shows the controller's newer demand seq: two acks that disagree (1 s apart), then an
    # incremental resync, long before the periodic refresh (20 heartbeats) an older controller would need.
    assert seen["after"] <= 7.0  # a few heartbeats (measured: 6 s)
    assert seen["reasons"] == {"digest"}


def test_a_new_lease_holder_sees_the_previous_holders_facts_before_it_is_synced(mock_run, memory_controller):
    """b joins and resyncs while a holds the lease; a commits an intent (never pushed to b) and goes away; when b
    acquires, it is not ``synced_for`` the provider until a resync sent after the grant is in, and that view holds
    a's intent."""
    seen = {}

    async def main():
        async with memory_controller(ttl=10.0, check_interval=1.0) as mem:
            net = Net(mem)
            a, b = Daemon(net, "prov-a", seed=1), Daemon(net, "prov-b", seed=2)

            def at_grant(record):  # the grant is held (emitted after the keeper took it)
                if record["event"] == "lease_acquired" and record["provider"] == "sim":
                    seen.setdefault("at_grant", b.session.synced_for("sim"))

            b.events.watchers.append(at_grant)
            async with trio.open_nursery() as nursery:
                a_scope = trio.CancelScope()

                async def run_a():
                    with a_scope:
                        await a.run()

                nursery.start_soon(run_a)
                await wait_for(lambda: a.keeper.valid() and a.session.synced_for("sim"))
                await nursery.start(b.run)
                await wait_for(lambda: b.session.state is LinkState.UP)
                b_view = b.session.view
                intent = RequestIntent("sim", NO_EPOCH, "op-a", "t", 1, ("ref-a",), ("ab" * 32,))
                async with a.gate.mutation("sim", intent):
                    pass
                seen["b_before"] = "op-a" in b.session.view.facts.intents
                seen["same_view"] = b.session.view is b_view
                a_scope.cancel()  # a dies holding the lease: b gets it once it expires
                await wait_for(lambda: b.keeper.valid())
                await wait_for(lambda: b.session.synced_for("sim"))
                seen["b_after"] = "op-a" in b.session.view.facts.intents
                seen["sync_seq"] = b.session.view.sync_seq
                seen["reasons"] = [reason for _, reason in b.refreshes()]
                nursery.cancel_scope.cancel()

    mock_run(main)
    assert seen["b_before"] is False and seen["same_view"] is True
    assert seen["at_grant"] is False
    assert seen["b_after"] is True and seen["sync_seq"] >= 1
    assert "requested" in seen["reasons"]
