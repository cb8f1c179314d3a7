"""Virtual time for tests of the daemon's parts: ``mock_run`` runs an async function on ``MockClock`` with
``autojump_threshold=0`` (the clock jumps to the next deadline as soon as every task is blocked), from virtual
time 0.

It is bounded: a test waiting for something that never happens would otherwise jump the clock forever; it fails
with ``trio.TooSlowError`` after ``limit`` virtual seconds instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
import trio.testing

T = TypeVar("T")


def mock_run(fn: Callable[[], Awaitable[T]], limit: float = 100_000.0) -> T:
    """``await fn()`` on a fresh ``MockClock``, failing after ``limit`` virtual seconds."""

    async def bounded() -> T:
        with trio.fail_after(limit):
            return await fn()

    return trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))
