"""A fail at the provisioning deadline waits for a listing of its op (``Operations._attribute``), but not forever:
never for a legacy call whose outcome is unknown (listed once: what its answered calls made), and at most
``DEFER_MAX`` seconds for a listing that keeps failing (bench/restarts.py, legacy: a demand of 3 left at 0 machines
for 240 s behind a fail that waited for a listing the legacy plugin can never give). MockClock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from provisionerd.domain.model import NO_EPOCH, RequestIntent
from provisionerd.execution.loop_inputs import LoopSettings
from provisionerd.execution.op_book import OpBook
from provisionerd.execution.operations import DEFER_MAX, Operations
from provisionerd.telemetry.events import EventLog

INTENT = RequestIntent("p", NO_EPOCH, "op-1", "t", 1, ("op-1/0",), ("0" * 64,))


class Executor:
    def __init__(self, legacy: bool, unknown: tuple[str, ...] = ()) -> None:
        self.ops = OpBook()
        self.lists = 0
        outcomes = tuple(SimpleNamespace(op_id=op) for op in unknown)
        self._client = SimpleNamespace(legacy=legacy, unknown_outcomes=lambda: outcomes)

    def serves(self, provider: str) -> bool:
        return True

    def client(self, provider: str) -> Any:
        return self._client

    async def attribute_op(self, intent: RequestIntent) -> None:
        self.lists += 1
        return None  # the listing fails


def operations(executor: Executor) -> Operations:
    ops = Operations(executor, EventLog(keep=100), LoopSettings(), wall=lambda: 0.0)  # type: ignore[arg-type]
    ops._view = SimpleNamespace(facts=SimpleNamespace(intents={"op-1": SimpleNamespace(intent=INTENT)}))  # type: ignore[assignment]
    return ops


def run(fn: Any) -> Any:
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_failing_listing_defers_the_fail_until_it_has_waited_defer_max() -> None:
    async def main() -> list[bool]:
        executor = Executor(legacy=False)
        ops = operations(executor)
        record = executor.ops.claim("op-1", "fail", "p")
        assert record is not None
        seen = [await ops._attribute(record, "op-1")]
        await trio.sleep(DEFER_MAX - 10)
        seen.append(await ops._attribute(record, "op-1"))
        await trio.sleep(10)
        seen.append(await ops._attribute(record, "op-1"))
        assert executor.lists == 6  # 3 tries each deferral, none once it gave up
        return seen

    assert run(main) == [False, False, True]


def test_a_legacy_call_whose_outcome_is_unknown_is_failed_at_once() -> None:
    """After one listing of what its answered calls made (seed 270 of the legacy worlds), failed or not."""

    async def main() -> bool:
        executor = Executor(legacy=True, unknown=("op-1",))
        record = executor.ops.claim("op-1", "fail", "p")
        assert record is not None
        went_ahead = await operations(executor)._attribute(record, "op-1")
        assert executor.lists == 1
        return went_ahead

    assert run(main) is True
