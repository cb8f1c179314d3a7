"""The rig's waits (tests/rigs/wait.py) on trio's MockClock: the default polling starts at 50 ms and grows to
250 ms, a given interval stays fixed, and a wait that never comes names what it waited for."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing
from rigs import wait


def test_the_default_pauses_grow_from_50_ms_to_250_ms_and_a_given_interval_stays() -> None:
    default = list(itertools.islice(wait._pauses(None), 8))
    assert default[0] == 0.05 and default[-1] == 0.25
    assert all(b >= a for a, b in itertools.pairwise(default))
    assert list(itertools.islice(wait._pauses(0.3), 3)) == [0.3, 0.3, 0.3]


def test_a_30_s_wait_probes_far_fewer_times_than_every_50_ms_and_sees_the_answer_within_250_ms() -> None:
    calls: list[float] = []

    async def main() -> tuple[str, float]:
        async def probe() -> str | None:
            calls.append(trio.current_time())
            return "up" if trio.current_time() >= 30.0 else None

        got = await wait.until("up", probe, 60)
        return got, trio.current_time()

    got, at = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert got == "up" and 30.0 <= at <= 30.25
    assert len(calls) < 130  # 600 at a fixed 50 ms


def test_a_wait_that_never_comes_names_it_and_the_last_answer() -> None:
    async def main() -> None:
        async def probe() -> int:
            return 0

        await wait.until("the thing", probe, 2)

    with pytest.raises(wait.WaitTimeout, match=r"not within 2 s: the thing; last seen: 0"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
