"""A fail at the provisioning deadline waits for a listing of its op (``Operations._attribute``), but not forever:
at most ``DEFER_MAX`` seconds for a listing that keeps failing. A legacy op with a lost call is listed for what its
answered calls made; what the adapter cannot list (nothing answered) is no reason to wait (bench/restarts.py,
legacy: a demand of 3 left at 0 machines for 240 s behind a fail that waited for a listing the legacy plugin can
never give), but a listing that fails is (seed 741613929: failed unlisted, two machines ran with no fact). MockClock."""

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
    def __init__(self, legacy: bool, unknown: tuple[str, ...] = (), unlistable: bool = False) -> None:
        self.ops = OpBook()
        self.lists = 0
        self.unlistable = unlistable  # the plugin says the op cannot be listed (else: the listing fails)
        self.as_empty: list[bool] = []
        outcomes = tuple(SimpleNamespace(op_id=op) for op in unknown)
        self._client = SimpleNamespace(legacy=legacy, unknown_outcomes=lambda: outcomes)

    def serves(self, provider: str) -> bool:
        return True

    def client(self, provider: str) -> Any:
        return self._client

    async def attribute_op(self, intent: RequestIntent, *, unlistable_as_empty: bool = False) -> tuple[str, ...] | None:
        self.lists += 1
        self.as_empty.append(unlistable_as_empty)
        return () if self.unlistable and unlistable_as_empty else None


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


def test_a_legacy_op_none_of_whose_calls_answered_is_failed_at_once() -> None:
    """Nothing answered: the adapter cannot list it (``ProviderUnsupported``), which is "nothing listable" for a
    legacy op with a lost call only."""

    async def main(legacy_unknown: bool) -> tuple[bool, int, list[bool]]:
        executor = Executor(legacy=True, unknown=("op-1",) if legacy_unknown else (), unlistable=True)
        record = executor.ops.claim("op-1", "fail", "p")
        assert record is not None
        went_ahead = await operations(executor)._attribute(record, "op-1")
        return went_ahead, executor.lists, executor.as_empty

    assert run(lambda: main(True)) == (True, 1, [True])
    assert run(lambda: main(False)) == (False, 3, [False, False, False])  # an ordinary op: deferred


def test_a_legacy_op_with_a_lost_call_whose_listing_fails_is_deferred_like_any_other() -> None:
    """Seed 741613929 of the legacy worlds: its answered calls made machines, and the plugin crashed on each read."""

    async def main() -> tuple[bool, int]:
        executor = Executor(legacy=True, unknown=("op-1",))
        record = executor.ops.claim("op-1", "fail", "p")
        assert record is not None
        return await operations(executor)._attribute(record, "op-1"), executor.lists

    assert run(main) == (False, 3)
