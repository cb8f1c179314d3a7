"""The daemon's side of ``Join.instance`` against the reference controller (in-memory streams, MockClock).

A session draws its instance once and sends it on every (re)join, so a link break does not cost the lease; a new
process start (a new session) is a new holder: after a crash it waits for the old lease without spinning, and gets
it within ttl + check interval; after a clean release it gets it at once. Controller: promoted at t=0, ttl 30 s,
check 5 s (grace until t=35).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import trio
import trio.testing
from rc_client import Harness, memory_controller, on_mock_clock

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper, LeaseState
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import LinkState, SessionSettings
from provisionerd.domain.model import Role
from provisionerd.telemetry.events import EventLog

TTL, CHECK = 30.0, 5.0
BACKOFF = Backoff(initial=0.2, max=4.0)


class Process:
    """One start of a daemon: its session and lease keeper wired as ``DaemonCore`` wires them."""

    def __init__(self, h: Harness, seed: int, identity: str = "prov") -> None:
        self.events = EventLog(keep=10_000)
        rng = random.Random(seed)
        settings = SessionSettings(
            identity=identity,
            providers=("aws",),
            addresses=tuple(h.cluster.replicas.addresses),
            connect_timeout=2.0,
            request_timeout=5.0,
            heartbeat_interval=1.0,
            heartbeat_timeout=3.0,
            backoff=BACKOFF,
        )
        self.session = ControllerSession(settings, self._connect, self.events, rng)
        self.keeper = LeaseKeeper(
            "aws",
            ControllerOps(self.session),
            margin=2.0,
            backoff=BACKOFF,
            rng=rng,
            events=self.events,
            rejoined=self.session.rejoined,
            freed=self.session.lease_freed["aws"],
        )
        self.h = h
        self.scope = trio.CancelScope()
        self.keeper_scope = trio.CancelScope()

    async def _connect(self, address: str) -> trio.abc.Stream:
        client, server_side = trio.testing.memory_stream_pair()
        replica = self.h.cluster.replicas.addresses.index(address)
        self.h.nursery.start_soon(self.h.server.handle_stream, server_side, replica, Role.PROVISIONER)
        return client

    def start(self, nursery: trio.Nursery) -> None:
        async def keep() -> None:
            with self.keeper_scope:
                await self.keeper.run()

        async def run() -> None:
            with self.scope:
                async with trio.open_nursery() as inner:
                    await inner.start(self.session.run)
                    inner.start_soon(keep)

        nursery.start_soon(run)

    def kill(self) -> None:
        """A crash: the process is gone, it releases nothing."""
        self.scope.cancel()

    async def stop(self) -> None:
        """A clean stop (SIGTERM): the keeper stops, the lease is given back over the live link, then the end."""
        self.keeper_scope.cancel()
        await self.keeper.release(timeout=3.0)
        self.scope.cancel()

    def count(self, event: str) -> int:
        return sum(1 for e in self.events.recent if e["event"] == event)


async def wait_for(predicate, limit: float = 600.0) -> float:
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - waits on any predicate over the system under test, which has no event for it
            await trio.sleep(0.05)
    return trio.current_time()


def test_a_session_draws_its_instance_once_from_its_rng():
    settings = SessionSettings(identity="prov", providers=("aws",), addresses=("c:1",))
    one, same, other = (ControllerSession(settings, None, EventLog(), random.Random(s)) for s in (1, 1, 2))
    assert re.fullmatch(r"[0-9a-f]{16}", one.instance)
    assert one.instance == same.instance != other.instance  # seeded: a simulation repeats; starts differ
    assert one.status()["instance"] == one.instance
    fixed = ControllerSession(
        SessionSettings(identity="p", providers=(), addresses=("c:1",), instance="abc"),
        None,
        EventLog(),
        random.Random(1),
    )
    assert fixed.instance == "abc"
    for bad in ("a#b", "x" * 65, "new\nline"):
        with pytest.raises(ValueError, match="instance"):
            ControllerSession(
                SessionSettings(identity="p", providers=(), addresses=("c:1",), instance=bad),
                None,
                EventLog(),
                random.Random(1),
            )


@on_mock_clock
async def test_a_rejoin_sends_the_same_instance_and_keeps_the_epoch(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, ttl=TTL, check=CHECK) as h, trio.open_nursery() as nursery:
        daemon = Process(h, seed=1)
        daemon.start(nursery)
        epoch = await daemon.keeper.wait_valid()
        (session,) = h.server.sessions
        assert session.join.instance == daemon.session.instance and session.holder == f"prov#{daemon.session.instance}"
        daemon.session.break_link("test: the link broke")
        await wait_for(lambda: daemon.session.generation == 2 and daemon.session.state is LinkState.UP)
        await wait_for(lambda: daemon.count("lease_renewed") >= 1 and daemon.keeper.valid())
        assert daemon.keeper.epoch == epoch and daemon.count("lease_lost") == 0
        joins = [e for e in daemon.events.recent if e["event"] == "join"]
        assert [j["instance"] for j in joins] == [daemon.session.instance] * 2
        assert [s.join.instance for s in h.server.sessions] == [daemon.session.instance]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("failover", [False, True], ids=["same-primary", "failover-at-the-crash"])
@on_mock_clock
async def test_a_restarted_process_waits_for_its_old_lease_quietly(tmp_path: Path, failover: bool) -> None:
    async with memory_controller(tmp_path, ttl=TTL, check=CHECK) as h, trio.open_nursery() as nursery:
        crashed = Process(h, seed=1)
        crashed.start(nursery)
        await crashed.keeper.wait_valid()
        await trio.sleep(50)  # renewed meanwhile
        crashed.kill()
        died = trio.current_time()
        if failover:
            h.cluster.fail_over(died)
            h.server.disconnect_replica(0)
        restarted = Process(h, seed=2)
        assert restarted.session.instance != crashed.session.instance
        restarted.start(nursery)
        await wait_for(lambda: restarted.keeper.state is LeaseState.HELD)
        acquired = next(e["mono"] for e in restarted.events.recent if e["event"] == "lease_acquired")
        assert 0 < acquired - died <= TTL + CHECK
        if failover:  # nobody can be re-granted in the grace: the last grantee is dead
            assert acquired == pytest.approx(died + TTL + CHECK, abs=0.002)
        denials = [e for e in restarted.events.recent if e["event"] == "lease_denied"]
        # It waits for the time the controller names instead of polling: one denial (plus one if the controller's
        # answer raced the expiry by a rounding millisecond).
        assert 1 <= len(denials) <= 2, denials
        assert denials[0]["reason"] == ("grace" if failover else "held") and denials[0]["retry_after"] > 1.0
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_released_lease_goes_to_the_next_start_at_once(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, ttl=TTL, check=CHECK) as h, trio.open_nursery() as nursery:
        stopping = Process(h, seed=1)
        stopping.start(nursery)
        old = await stopping.keeper.wait_valid()
        await trio.sleep(10)
        await stopping.stop()
        assert [e["confirmed"] for e in stopping.events.recent if e["event"] == "lease_released"] == [True]
        stopped = trio.current_time()
        restarted = Process(h, seed=2)
        restarted.start(nursery)
        new = await restarted.keeper.wait_valid()
        assert new > old and trio.current_time() - stopped < 0.5 and restarted.count("lease_denied") == 0
        nursery.cancel_scope.cancel()
