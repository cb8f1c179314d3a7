"""Virtual time for tests of the daemon's pieces without processes: ``trio.testing.MockClock`` that jumps as soon as
every task sleeps, bounded so that a wait for something that never happens fails instead of jumping forever."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
import trio.testing

T = TypeVar("T")

#: Virtual seconds after which a run fails (``trio.TooSlowError``): far beyond any scenario's own timings.
LIMIT = 100_000.0


def mock_run(fn: Callable[[], Awaitable[T]], limit: float = LIMIT) -> T:
    """``fn()`` on ``MockClock(autojump_threshold=0)`` from virtual time 0, failing after ``limit`` virtual seconds."""

    async def bounded() -> T:
        with trio.fail_after(limit):
            return await fn()

    return trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))
