"""A lease TTL the keeper's margin cannot use: one ERROR and one ``lease_unusable`` event at the first grant, then
no more acquisitions (not ``lease_denied grant_too_late`` twice a second for ever). MockClock, exact times."""

from __future__ import annotations

import logging

import pytest
import trio

from provisionerd.config.proofs import lease_window_problem
from provisionerd.controller.lease import LeaseState
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_controller import FakeController


@pytest.mark.parametrize(("ttl", "margin"), [(3.0, 10.0), (3.0, 3.0), (3.0, 2.5)])
def test_an_unusable_first_grant_gives_one_error_and_no_livelock(mock_run, make_keeper, caplog, ttl, margin):
    controller = FakeController(ttl=ttl)
    events = EventLog(keep=5000)
    keeper = make_keeper("sim", controller.link("a", latency=0.05), events, margin=margin)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            await trio.sleep(3600.0)  # an hour of virtual time: a livelock would ask ~7000 times
            assert not keeper.valid()
            assert keeper.state is LeaseState.NONE
            assert "lease unusable" in keeper.status().reason
            await keeper.release()
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.INFO, logger="provisionerd.controller.lease"):
        mock_run(main)
    assert len(controller.grants) == 1  # asked once; never again
    unusable = list(events.of_kind("lease_unusable"))
    assert len(unusable) == 1
    assert unusable[0]["provider"] == "sim" and unusable[0]["ttl"] == ttl and unusable[0]["margin"] == margin
    assert unusable[0]["mono"] == pytest.approx(0.1)  # the reply to the first acquire (latency 0.05 each way)
    assert not list(events.of_kind("lease_denied")) and not list(events.of_kind("lease_acquired"))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "lease.margin" in errors[0].getMessage()


def test_a_usable_grant_is_held(mock_run, make_keeper):
    controller = FakeController(ttl=3.0)
    events = EventLog()
    keeper = make_keeper("sim", controller.link("a", latency=0.05), events, margin=1.0)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            await keeper.wait_valid()
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert not list(events.of_kind("lease_unusable"))


def test_the_window_rule():
    assert lease_window_problem(3.0, 10.0) is not None and "not below the lease TTL" in lease_window_problem(3.0, 10.0)
    assert lease_window_problem(3.0, 2.0) is not None  # trusted 1 s, renewed at 1 s: lapses before every renewal
    assert lease_window_problem(3.0, 1.9) is None
    assert lease_window_problem(30.0, 2.0) is None
