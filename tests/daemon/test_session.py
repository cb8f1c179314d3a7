"""The controller session against the reference controller's server over in-memory streams, on MockClock."""

from __future__ import annotations

import random

import pytest
import trio
from rigs.memory import memory_session_settings, running

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper, LeaseState
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import LinkState, SessionSettings
from provisionerd.domain.errors import ControllerRejected, LinkDown
from provisionerd.domain.model import NO_EPOCH, DemandItem, Epoch, RequestIntent, ResourceShape
from provisionerd.execution.gate import MutationGate, violations
from provisionerd.telemetry.events import EventLog


def settings(addresses, identity="prov-a", providers=("sim",), **kw) -> SessionSettings:
    return memory_session_settings(addresses, identity, providers, **kw)


class Daemon:
    """The session, its lease keepers and the gate, wired as the daemon wires them."""

    def __init__(self, net, addresses=None, identity="prov-a", providers=("sim",), seed=1, margin=2.0):
        self.events = EventLog(keep=10_000)
        rng = random.Random(seed)
        self.session = ControllerSession(
            settings(addresses or net.addresses, identity, providers), net.connect, self.events, rng
        )
        self.ops = ControllerOps(self.session)
        self.keepers = {
            p: LeaseKeeper(
                p,
                self.ops,
                margin=margin,
                backoff=Backoff(initial=0.2, max=4.0),
                rng=rng,
                events=self.events,
                rejoined=self.session.rejoined,
            )
            for p in providers
        }
        self.gate = MutationGate(self.keepers, self.ops, self.events)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as nursery:
            await nursery.start(self.session.run)
            for keeper in self.keepers.values():
                await nursery.start(keeper.run)
            task_status.started()

    def kinds(self, *names):
        return [e for e in self.events.recent if e["event"] in names]


def intent(op_id: str) -> RequestIntent:
    return RequestIntent(
        provider="sim",
        epoch=NO_EPOCH,
        op_id=op_id,
        template_id="t",
        count=1,
        instance_refs=(f"ref-{op_id}",),
        token_hashes=("ab" * 32,),
    )


ITEM = DemandItem(demand_id="d1", shape=ResourceShape(ncpus=4), count=3)


async def wait_for(predicate, what: str, limit: float = 120.0):
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - waits on any predicate over the system under test, which has no event for it
            await trio.sleep(0.01)
    return trio.current_time()


def test_join_follows_the_redirect_resyncs_and_gets_demand(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller() as net:
            net.server.cluster.set_demand([ITEM])
            daemon = Daemon(net, addresses=("ctl1:7400", "ctl0:7400", "ctl2:7400"))
            async with running(daemon):
                await wait_for(lambda: daemon.session.view is not None and daemon.session.view.complete, "view")
                view = daemon.session.view
                seen.update(
                    primary=daemon.session.primary,
                    generation=view.generation,
                    demand=view.demand,
                    connects=[a for _, a in net.connects],
                    state=daemon.session.state,
                )
            seen["events"] = [e["event"] for e in daemon.kinds("redirect", "join", "link_up", "resync")]

    mock_run(main)
    assert seen["connects"] == ["ctl1:7400", "ctl0:7400"]
    assert seen["primary"] == "ctl0:7400" and seen["generation"] == 1 and seen["state"] is LinkState.UP
    assert seen["demand"].items == (ITEM,)
    assert seen["events"] == ["redirect", "join", "link_up", "resync"]


def test_lease_gate_and_facts_over_the_session(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller(ttl=30.0) as net:
            daemon = Daemon(net)
            async with running(daemon):
                keeper = daemon.keepers["sim"]
                epoch = await keeper.wait_valid()
                async with daemon.gate.mutation("sim", intent("op-1")) as permit:
                    seen["permit"] = permit
                view = daemon.session.view
                seen["folded"] = "op-1" in view.facts.intents
                await trio.sleep(600.0)  # ten minutes of renewals and heartbeats
                seen["still"] = keeper.current()
                seen["epoch"] = epoch
            seen["store"] = [c.fact.op_id for c in net.server.cluster.store.all_facts()]
            seen["renewals"] = len(daemon.kinds("lease_renewed"))
            seen["generations"] = daemon.session.generation

    mock_run(main)
    assert seen["permit"].epoch == seen["epoch"] == seen["still"]
    assert seen["folded"] and seen["store"] == ["op-1"]
    assert seen["renewals"] >= 59 and seen["generations"] == 1


def test_failover_rejoins_resyncs_and_reacquires_a_higher_epoch(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller(ttl=30.0, check_interval=5.0) as net:
            daemon = Daemon(net)
            async with running(daemon):
                keeper = daemon.keepers["sim"]
                first = await keeper.wait_valid()
                async with daemon.gate.mutation("sim", intent("op-1")):
                    pass
                old_view = daemon.session.view
                await trio.sleep(4.0)
                failed_at = trio.current_time()
                net.fail_over()  # replica 1 becomes primary in term 2; every session of replica 0 is cut
                await wait_for(
                    lambda: daemon.session.generation == 2 and daemon.session.state is LinkState.UP, "rejoin"
                )
                new_view = daemon.session.view
                await wait_for(lambda: keeper.valid() and keeper.epoch != first, "re-acquired")
                second = keeper.epoch
                seen.update(
                    first=first,
                    second=second,
                    failed_at=failed_at,
                    reacquired=trio.current_time(),
                    old_view=old_view,
                    new_view=new_view,
                    primary=daemon.session.primary,
                )
                async with daemon.gate.mutation("sim", intent("op-2")) as permit:
                    seen["permit_epoch"] = permit.epoch
                seen["events"] = [
                    (e["event"])
                    for e in daemon.kinds("link_down", "redirect", "join", "resync", "lease_lost", "lease_acquired")
                ]

    mock_run(main)
    assert seen["second"] > seen["first"] and seen["second"].term == seen["first"].term + 1
    assert seen["permit_epoch"] == seen["second"]
    assert seen["primary"] == "ctl1:7400"
    # The view was rebuilt from the resync, not carried over: a new object holding the committed intent.
    assert seen["new_view"] is not seen["old_view"] and seen["new_view"].generation == 2
    assert "op-1" in seen["new_view"].facts.intents
    # The previous holder gets the provider back at once (no grace for it), well before its old deadline.
    assert seen["reacquired"] - seen["failed_at"] < 5.0
    assert seen["events"] == [
        "join",
        "resync",
        "lease_acquired",  # generation 1
        "link_down",
        "redirect",
        "join",
        "resync",  # ctl0 is a standby now: redirected to ctl1
        "lease_lost",
        "lease_acquired",
    ]  # the renewal right after the resync is refused


def test_stale_epoch_fact_is_rejected_and_the_daemon_recovers_by_reacquiring(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller(ttl=30.0) as net:
            daemon = Daemon(net)
            async with running(daemon):
                keeper = daemon.keepers["sim"]
                first = await keeper.wait_valid()
                # Another primary term arrives without our link noticing (the lease table is emptied in place).
                cluster = net.server.cluster
                cluster.replicas.term += 1
                from refcontroller.leases import LeaseTable

                cluster.leases = LeaseTable(cluster.term, trio.current_time(), cluster.ttl, cluster.check_interval)
                cluster.replicas.promoted_at = trio.current_time()
                with pytest.raises(ControllerRejected) as info:
                    async with daemon.gate.mutation("sim", intent("op-stale")):
                        raise AssertionError("must not run")
                seen["reason"] = info.value.reason
                seen["lapsed"] = keeper.state is not LeaseState.HELD or not keeper.valid()
                second = await keeper.wait_valid()
                async with daemon.gate.mutation("sim", intent("op-fresh")) as permit:
                    seen["epochs"] = (first, second, permit.epoch)
            seen["store"] = [(c.fact.op_id, c.fact.epoch) for c in net.server.cluster.store.all_facts()]
            seen["decisions"] = [d.outcome for d in daemon.gate.decisions]
            seen["violations"] = violations(daemon.gate.decisions)

    mock_run(main)
    first, second, used = seen["epochs"]
    assert seen["reason"] == "stale_epoch" and seen["lapsed"]
    assert second > first and used == second
    assert seen["store"] == [("op-fresh", second)]
    assert seen["decisions"] == ["rejected", "admitted", "finished"]
    assert seen["violations"] == []


def test_dead_link_is_detected_by_heartbeat_and_the_session_resyncs_after_heal(mock_run, memory_controller):
    seen = {}

    async def main():
        async with memory_controller(ttl=30.0, heartbeat=15.0) as net:
            daemon = Daemon(net)
            async with running(daemon):
                keeper = daemon.keepers["sim"]
                await keeper.wait_valid()
                acquired_at = trio.current_time()  # 35.0: a freshly started controller waits out its grace first
                await trio.sleep_until(acquired_at + 20.5)
                net.partitioned = True
                seen["down_at"] = await wait_for(lambda: daemon.session.state is not LinkState.UP, "link down")
                seen["lost_at"] = await wait_for(lambda: keeper.state is LeaseState.LAPSED, "lapse")
                with pytest.raises(LinkDown):
                    await daemon.ops.commit(intent("x"))
                await trio.sleep_until(acquired_at + 60.0)
                net.partitioned = False
                await wait_for(lambda: daemon.session.state is LinkState.UP, "rejoin")
                seen["epoch"] = await keeper.wait_valid()
                seen["generation"] = daemon.session.generation
                seen["acquired_at"] = acquired_at
            seen["lost"] = next(daemon.events.of_kind("lease_lost"))
            seen["denied"] = next(daemon.events.of_kind("lease_denied"))
            seen["link_down"] = next(daemon.events.of_kind("link_down"))

    mock_run(main)
    t0 = seen["acquired_at"]
    assert t0 == 35.0 and seen["denied"]["reason"] == "grace"
    # Heartbeats every 1 s from the join at 0; the last ack came at t0 + 20; dead 3 s later.
    assert seen["down_at"] == pytest.approx(t0 + 23.0, abs=0.02)
    assert seen["link_down"]["mono"] == t0 + 23.0 and seen["link_down"]["reason"] == "no heartbeat ack for 3s"
    # The lease lapses on its own clock: renewals sent at t0 + 10, t0 + 20; trusted until t0 + 20 + 30 - 2.
    assert seen["lost"]["mono"] == t0 + 48.0
    assert seen["lost_at"] == pytest.approx(t0 + 48.0, abs=0.02)
    assert seen["lost"]["reason"] == "local deadline passed without a renewal"
    assert seen["generation"] == 2 and seen["epoch"] > Epoch(0, 0)


@pytest.mark.parametrize("failover", [False, True])
def test_standby_daemon_takes_over_only_after_expiry_or_the_controllers_grace(mock_run, memory_controller, failover):
    seen = {}

    async def main():
        async with memory_controller(ttl=30.0, check_interval=5.0) as net:
            active, standby = Daemon(net, identity="prov-a", seed=1), Daemon(net, identity="prov-b", seed=2)
            async with trio.open_nursery() as nursery:
                async with trio.open_nursery() as active_nursery:
                    await active_nursery.start(active.run)
                    first = await active.keepers["sim"].wait_valid()
                    async with active.gate.mutation("sim", intent("op-a")):
                        pass
                    await nursery.start(standby.run)
                    await trio.sleep(25.0)
                    assert standby.keepers["sim"].state is LeaseState.NONE
                    died_at = trio.current_time()
                    last_renewal = max(e["mono"] for e in active.events.of_kind("lease_acquired", "lease_renewed"))
                    active_nursery.cancel_scope.cancel()  # the holder dies without releasing
                if failover:
                    net.fail_over()
                second = await standby.keepers["sim"].wait_valid()
                seen.update(
                    first=first,
                    second=second,
                    died_at=died_at,
                    last_renewal=last_renewal,
                    took_over=trio.current_time(),
                )
                async with standby.gate.mutation("sim", intent("op-b")) as permit:
                    seen["permit"] = permit.epoch
                seen["denials"] = sorted({e["reason"] for e in standby.events.of_kind("lease_denied")})
                nursery.cancel_scope.cancel()
            seen["store"] = [(c.fact.op_id, c.fact.epoch) for c in net.server.cluster.store.all_facts()]

    mock_run(main)
    assert seen["second"] > seen["first"] and seen["permit"] == seen["second"]
    assert seen["store"] == [("op-a", seen["first"]), ("op-b", seen["second"])]
    if failover:
        # A new primary keeps the provider for its previous holder for ttl + check_interval after promotion.
        assert seen["took_over"] == pytest.approx(seen["died_at"] + 35.0, abs=0.01)
        assert seen["denials"] == ["grace", "held"]
    else:
        # Without failover the controller's lease simply runs out: ttl after the last renewal reached it.
        assert seen["took_over"] == pytest.approx(seen["last_renewal"] + 30.0, abs=0.01)
        assert seen["denials"] == ["held"]


def test_multi_page_demand_host_pushes_and_the_updates_channel(mock_run, memory_controller):
    from provisionerd.domain.model import HostState, HostStatus

    big = [DemandItem(demand_id=f"d{i}", shape=ResourceShape(ncpus=1 + i % 8), count=1) for i in range(1200)]
    host = HostState("ref-1", "sim", "m-1", HostStatus.IDLE, 100.0)
    other = HostState("ref-2", "elsewhere", "m-2", HostStatus.BUSY, 100.0)
    seen = {}

    async def main():
        async with memory_controller() as net:
            net.server.cluster.set_demand(big)
            net.server.cluster.hosts.add(host)  # known before we join: comes with the resync
            daemon = Daemon(net)
            async with running(daemon) as nursery:
                updates = await nursery.start(daemon.session.updates)
                view = await updates.receive()
                while not view.complete:
                    view = await updates.receive()
                seen["first"] = (view.demand.seq, len(view.demand.items), dict(view.hosts))
                net.server.cluster.set_demand(big[:3])
                net.server.broadcast_demand()
                busy = HostState("ref-1", "sim", "m-1", HostStatus.BUSY, 101.0)
                net.server.broadcast_host(busy)
                net.server.broadcast_host(other)  # not one of our providers: not pushed to us
                while not (len(view.demand.items) == 3 and view.hosts["ref-1"] == busy):
                    view = await updates.receive()
                seen["second"] = (view.demand.seq, view.demand.items, dict(view.hosts), view.generation)

    mock_run(main)
    seq1, count1, hosts1 = seen["first"]
    assert count1 == 1200 and hosts1 == {"ref-1": host}
    seq2, items2, hosts2, generation = seen["second"]
    assert seq2 > seq1 and items2 == tuple(big[:3]) and generation == 1
    assert set(hosts2) == {"ref-1"}
