"""Make this folder's helpers importable (pytest runs in importlib mode) and run tests on a bounded MockClock."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from rigs.clock import mock_run as mock_run_on_clock

sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture
def mock_run() -> Callable[..., Any]:
    """Run an async function on a bounded ``MockClock`` from virtual time 0 (``rigs.clock.mock_run``)."""
    return mock_run_on_clock


@pytest.fixture
def run_rig(mock_run: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``scenario(rig, nursery)`` on a started rig (``lifecycle_rig.build_rig`` with ``providers`` and
    ``options``; ``loop=False`` leaves the reconcile loop for the scenario to start) on MockClock, then stop it all.

    Returns the rig; a scenario records what else the test checks into its own closure."""
    from lifecycle_rig import build_rig, start_rig

    def run(
        scenario: Callable[..., Awaitable[Any]], providers: dict[str, Any], *, loop: bool = True, **options: Any
    ) -> Any:
        async def main() -> Any:
            async with trio.open_nursery() as nursery:
                rig = build_rig(nursery, providers, **options)
                await start_rig(nursery, rig, loop=loop)
                await scenario(rig, nursery)
                nursery.cancel_scope.cancel()
            return rig

        return mock_run(main)

    return run
