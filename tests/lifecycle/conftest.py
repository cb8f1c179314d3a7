"""Make this folder's helpers importable (pytest runs in importlib mode) and run tests on a bounded MockClock."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture
def mock_run() -> Callable[[Callable[[], Awaitable[Any]]], Any]:
    """Run an async function on ``MockClock(autojump_threshold=0)`` from virtual time 0, bounded."""

    def run(fn: Callable[[], Awaitable[Any]], limit: float = 100_000.0) -> Any:
        async def bounded() -> Any:
            with trio.fail_after(limit):
                return await fn()

        return trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))

    return run
