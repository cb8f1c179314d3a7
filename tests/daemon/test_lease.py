"""The lease keeper on trio's MockClock against an in-memory controller: exact virtual times."""

from __future__ import annotations

from itertools import pairwise

import pytest
import trio

from provisionerd.controller.lease import LeaseState
from provisionerd.domain.errors import LeaseError
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_controller import FakeController


def test_renewals_over_a_simulated_hour_keep_one_epoch(mock_run, make_keeper):
    controller = FakeController(ttl=30.0)
    events = EventLog(keep=5000)
    link = controller.link("a", latency=0.05)
    keeper = make_keeper("sim", link, events)
    gaps: list[float] = []

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            epoch = await keeper.wait_valid()
            # Sample validity every 2.5 s for an hour (never in step with the 10 s renewals): it never drops.
            for _ in range(1440):
                await trio.sleep(2.5)
                if not keeper.valid():
                    gaps.append(trio.current_time())
            assert keeper.current() == epoch
            nursery.cancel_scope.cancel()
        return trio.current_time()

    end = mock_run(main)
    assert end == pytest.approx(3600.1, abs=0.2)
    assert gaps == []
    renewals = list(events.of_kind("lease_renewed"))
    # One renewal every ttl/3 = 10 s, measured from when each renewal was sent.
    assert len(renewals) == 359
    times = [r["mono"] for r in renewals]
    assert all(b - a == pytest.approx(10.0) for a, b in pairwise(times))
    assert not list(events.of_kind("lease_lost"))
    assert len(controller.grants) == 1


def test_deadline_counts_from_when_the_request_was_sent(mock_run, make_keeper):
    controller = FakeController(ttl=30.0)
    keeper = make_keeper("sim", controller.link("a", latency=1.5), margin=2.0)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            await keeper.wait_valid()
            # acquire sent at 0, reply at 3.0: trusted until 0 + 30 - 2, not 3 + 28.
            assert trio.current_time() == 3.0
            assert keeper.valid_until == 28.0
            assert keeper.status().remaining == 25.0
            nursery.cancel_scope.cancel()

    mock_run(main)


def test_partition_lapses_exactly_at_the_local_deadline_then_reacquires_after_heal(mock_run, make_keeper):
    controller = FakeController(ttl=30.0, grace=30.0)
    events = EventLog()
    link = controller.link("a", request_timeout=5.0)
    keeper = make_keeper("sim", link, events, margin=2.0)
    seen: dict[str, object] = {}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            first = await keeper.wait_valid()
            await trio.sleep_until(95.0)
            link.partition()  # the last renewal went out at t=90: deadline 90 + 30 - 2 = 118
            assert keeper.valid_until == 118.0
            await trio.sleep_until(118.0 - 1e-6)
            assert keeper.valid() and keeper.current() == first
            await keeper.wait_changed()  # the lapse, as observers see it
            seen["lapsed_at"] = trio.current_time()
            assert keeper.state is LeaseState.LAPSED
            with pytest.raises(LeaseError):
                keeper.current()
            await trio.sleep_until(200.0)
            link.heal()
            second = await keeper.wait_valid()
            seen["reacquired_at"] = trio.current_time()
            seen["epochs"] = (first, second)
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert seen["lapsed_at"] == 118.0
    first, second = seen["epochs"]
    assert second > first
    assert seen["reacquired_at"] == 200.0  # the keeper waits for the link, then acquires at once
    lost = next(events.of_kind("lease_lost"))
    assert lost["mono"] == 118.0 and lost["epoch"] == first
    kinds = [e["event"] for e in events.recent if e["event"] in ("lease_acquired", "lease_lost")]
    assert kinds == ["lease_acquired", "lease_lost", "lease_acquired"]


def test_refused_renewal_lapses_at_once_and_failovers_give_strictly_higher_epochs(mock_run, make_keeper):
    controller = FakeController(ttl=30.0, grace=30.0)
    events = EventLog()
    keeper = make_keeper("sim", controller.link("a"), events)
    epochs: list[Epoch] = []

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            epochs.append(await keeper.wait_valid())
            for round_ in range(4):
                await trio.sleep(25.0 + round_)
                controller.failover()  # the new primary has no lease table: the next renewal is refused
                while keeper.valid() and keeper.epoch == epochs[-1]:
                    await keeper.wait_changed()
                epochs.append(await keeper.wait_valid())
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert all(a < b for a, b in pairwise(epochs))
    assert [e.term for e in epochs] == [1, 2, 3, 4, 5]
    # The previous holder is re-granted at once despite the grace: each lapse is followed by a grant in the same tick.
    lost = [e["mono"] for e in events.of_kind("lease_lost")]
    acquired = [e["mono"] for e in events.of_kind("lease_acquired")][1:]
    assert lost == acquired


def test_standby_takes_over_only_after_the_holders_lease_expires_and_the_grace(mock_run, make_keeper):
    controller = FakeController(ttl=30.0, grace=45.0)
    active_events, standby_events = EventLog(), EventLog()
    active = make_keeper("sim", controller.link("a"), active_events)
    standby = make_keeper("sim", controller.link("b"), standby_events, seed=8)
    seen: dict[str, float] = {}

    async def main():
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as active_nursery:
                active_nursery.start_soon(active.run)
                first = await active.wait_valid()
                # The holder commits a fact, so a new primary knows who held the provider last.
                controller.commit("a", _intent(first))
                await trio.sleep(1.0)
                nursery.start_soon(standby.run)
                await trio.sleep_until(50.0)
                assert standby.state is LeaseState.NONE
                # The holder dies at 50 (its last renewal reached the controller at 40).
                active_nursery.cancel_scope.cancel()
            await trio.sleep_until(52.0)
            controller.failover()  # ... and the primary fails over at 52: grace until 97
            await standby.wait_valid()
            seen["took_over_at"] = trio.current_time()
            seen["epoch"] = standby.epoch
            seen["first"] = first
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert seen["took_over_at"] == 97.0
    assert seen["epoch"] > seen["first"]
    reasons = {e["reason"] for e in standby_events.of_kind("lease_denied")}
    assert reasons == {"held", "grace"}


def test_standby_waits_for_the_controller_side_expiry_without_failover(mock_run, make_keeper):
    controller = FakeController(ttl=30.0)
    active = make_keeper("sim", controller.link("a"))
    standby = make_keeper("sim", controller.link("b"), seed=9)
    seen: dict[str, float] = {}

    async def main():
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as active_nursery:
                active_nursery.start_soon(active.run)
                await active.wait_valid()
                nursery.start_soon(standby.run)
                await trio.sleep_until(45.0)  # last renewal reached the controller at 40: it holds until 70
                active_nursery.cancel_scope.cancel()
            await standby.wait_valid()
            seen["at"] = trio.current_time()
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert seen["at"] == 70.0


def test_release_stops_mutations_and_frees_the_provider(mock_run, make_keeper):
    controller = FakeController(ttl=30.0)
    events = EventLog()
    keeper = make_keeper("sim", controller.link("a"), events)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            await keeper.wait_valid()
            nursery.cancel_scope.cancel()
        await keeper.release()
        assert keeper.state is LeaseState.RELEASED
        assert not keeper.valid()
        assert controller.holder("sim") is None

    mock_run(main)
    assert next(events.of_kind("lease_released"))["confirmed"] is True


def _intent(epoch: Epoch):
    from provisionerd.domain.model import RequestIntent

    return RequestIntent(
        provider="sim",
        epoch=epoch,
        op_id="op-1",
        template_id="t",
        count=1,
        instance_refs=("i-1",),
        token_hashes=("0" * 64,),
    )
