"""Handover without a gap (issue 22 item 5): the controller pushes ``LeaseFreed`` to a connection it denied a lease
as ``held`` once that lease ends, and the waiting keeper acquires at once instead of at its ``retry_after``.

In-memory streams on MockClock, the daemon's session and keeper wired as ``daemon.builder`` wires them. Controller:
promoted at t=0, ttl 30 s, check 5 s (grace until t=35; the tests start after it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from rc_client import Harness, memory_controller, on_mock_clock
from test_daemon_instance import CHECK, TTL, Process, wait_for

from provisionerd.controller.lease import LeaseState
from provisionerd.domain.model import Epoch


async def holder_and_standby(h: Harness, nursery: trio.Nursery) -> tuple[Process, Process, Epoch]:
    """Past the grace: a holder with the lease (its epoch returned) and a standby it was denied to, once."""
    await trio.sleep(TTL + CHECK + 1)
    holder, waiting = Process(h, seed=1), Process(h, seed=2)
    holder.start(nursery)
    epoch = await holder.keeper.wait_valid()
    waiting.start(nursery)
    await wait_for(lambda: waiting.count("lease_denied") == 1)
    return holder, waiting, epoch


def acquired_at(process: Process) -> float:
    return next(e["mono"] for e in process.events.recent if e["event"] == "lease_acquired")


@on_mock_clock
async def test_a_clean_release_goes_to_the_waiting_standby_at_that_instant(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, ttl=TTL, check=CHECK) as h, trio.open_nursery() as nursery:
        holder, waiting, old = await holder_and_standby(h, nursery)
        denial = next(e for e in waiting.events.recent if e["event"] == "lease_denied")
        assert denial["reason"] == "held" and denial["retry_after"] > 20  # it would sleep that long
        await trio.sleep(3)
        await holder.stop()
        released = trio.current_time()
        new = await waiting.keeper.wait_valid()
        assert new > old
        assert acquired_at(waiting) - released < 0.01  # the same instant on the mock clock (one round trip)
        assert waiting.count("lease_freed") == 1 and waiting.count("lease_denied") == 1
        assert h.cluster.leases.live("aws", trio.current_time()).holder == f"prov#{waiting.session.instance}"
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_an_expired_lease_is_pushed_to_the_standby_at_its_expiry(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, ttl=TTL, check=CHECK) as h, trio.open_nursery() as nursery:
        holder, waiting, _ = await holder_and_standby(h, nursery)
        await trio.sleep(47)  # the holder renews meanwhile: the standby's hint is behind the lease's expiry
        lease = h.cluster.leases.live("aws", trio.current_time())
        holder.kill()  # a crash: nothing is released, the lease expires on the controller's clock
        await wait_for(lambda: waiting.keeper.state is LeaseState.HELD)
        assert acquired_at(waiting) == pytest.approx(lease.expires_at, abs=0.01)
        # Pushed once (the keeper may have asked at that same instant on its own hint, then it did not need it).
        assert waiting.session.lease_freed["aws"].count == 1
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_release_in_the_grace_is_pushed_but_the_grace_still_decides(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, ttl=TTL, check=CHECK) as h, trio.open_nursery() as nursery:
        holder, waiting, _ = await holder_and_standby(h, nursery)
        promoted = trio.current_time()
        h.cluster.fail_over(promoted)  # a new primary: only the last grantee may hold until the grace ends
        h.server.disconnect_replica(0)
        await wait_for(lambda: holder.keeper.valid() and holder.session.generation >= 2)
        await wait_for(lambda: waiting.session.generation >= 2 and waiting.count("lease_denied") >= 2)
        await holder.stop()
        await wait_for(lambda: waiting.keeper.state is LeaseState.HELD)
        reasons = [e["reason"] for e in waiting.events.recent if e["event"] == "lease_denied"]
        assert "grace" in reasons
        assert acquired_at(waiting) >= promoted + TTL + CHECK  # never inside the grace
        nursery.cancel_scope.cancel()
