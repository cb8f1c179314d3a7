"""Deadlines of persistent calls, kept by one watchdog per plugin process (real processes, real clock).

The watchdog sleeps until the earliest deadline it knows of; these tests pin the cases where that could go wrong:
a shorter deadline arriving after longer ones, a call cancelled by its caller (not a timeout), and the other calls
in flight when one times out.
"""

from __future__ import annotations

import time

import pytest
import trio
from persistent_kit import run_with, status

from provisionerd.domain.errors import ProviderCrashed, ProviderTimeout

pytestmark = pytest.mark.process


def test_a_shorter_deadline_sent_after_a_longer_one_fires_on_time(config):
    async def body(client):
        outcomes: dict[str, BaseException] = {}

        async def one(rid, timeout):
            try:
                await status(client, rid, timeout=timeout)
            except (ProviderTimeout, ProviderCrashed) as exc:
                outcomes[rid] = exc

        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "sleep:30:long", 60.0)
            await trio.sleep(0.2)  # the watchdog is now asleep until the long call's deadline
            nursery.start_soon(one, "sleep:30:short", 1.0)
        elapsed = time.monotonic() - started
        after = await status(client, "ok:after")
        return outcomes, elapsed, after, client.restarts

    outcomes, elapsed, after, restarts = run_with(config, body)
    assert isinstance(outcomes["sleep:30:short"], ProviderTimeout)
    assert "within 1 s" in str(outcomes["sleep:30:short"])
    # The long call was in flight when the plugin was killed: its outcome is unknown, not a timeout of its own.
    long = outcomes["sleep:30:long"]
    assert type(long) is ProviderCrashed and long.outcome_unknown and "timed out" in str(long)
    assert elapsed < 10  # bounded by the short deadline plus the kill, far from the long one's 60 s
    assert after["requests"][0]["requestId"] == "after" and restarts == 1


def test_a_call_cancelled_by_its_caller_only_abandons_its_answer(config):
    async def body(client):
        with trio.move_on_after(0.3) as scope:
            await status(client, "sleep:0.8:late")
        assert scope.cancelled_caught
        assert (await status(client, "ok:meanwhile"))["requests"][0]["requestId"] == "meanwhile"
        await trio.sleep(1.0)  # the late answer arrives now and must be dropped quietly
        out = await status(client, "ok:after")
        return out, client.restarts

    out, restarts = run_with(config, body)
    assert out["requests"][0]["requestId"] == "after" and restarts == 0


def test_deadlines_that_never_pass_do_not_disturb_many_calls(config):
    async def body(client):
        got = []

        async def one(i):
            # Alternating deadlines move the watchdog's alarm back and forth while answers come in.
            out = await status(client, f"ok:c{i}", timeout=5.0 if i % 2 else 60.0)
            got.append(out["requests"][0]["requestId"])

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, i)
        return sorted(got), client.restarts

    got, restarts = run_with(config, body)
    assert got == sorted(f"c{i}" for i in range(200)) and restarts == 0


def test_a_negative_timeout_is_refused_before_anything_is_sent(config):
    async def body(client):
        with pytest.raises(ValueError, match="non-negative"):
            await status(client, "ok:x", timeout=-1)
        return await status(client, "ok:y")

    assert run_with(config, body)["requests"][0]["requestId"] == "y"
