"""A request whose run ended with an instance fact it could not commit (the controller link broke: a failover) is
recovered in the first pass that may, not ``recover_after`` (30 s) later: its machines run with no fact until then.
The demo's drain step showed it (issue 32): 5 of 8 facts landed before a failover, and the other 3 workers stayed
unreturned for 27 s after demand went to 0. Other unknown outcomes keep the ``recover_after`` wait. MockClock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.model import NO_EPOCH, RequestIntent
from provisionerd.execution.loop_inputs import LoopSettings
from provisionerd.execution.op_book import OpBook
from provisionerd.execution.operations import Operations
from provisionerd.execution.values import RequestOutcome
from provisionerd.planner.capacity import CapacityState
from provisionerd.telemetry.events import EventLog

INTENT = RequestIntent("p", NO_EPOCH, "op-1", "t", 2, ("op-1/0", "op-1/1"), ("0" * 64, "0" * 64))


class Executor:
    """Runs the request to ``code`` (an unknown outcome) and records when each recovery of it starts."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.recovered: list[float] = []
        self.ops = OpBook()

    async def request(self, action: RequestMachines, *, record: Any) -> RequestOutcome:
        return RequestOutcome(action.op_id, action.provider, "unknown", code=self.code)

    async def recover_request(self, intent: RequestIntent, *, record: Any) -> RequestOutcome:
        self.recovered.append(trio.current_time())
        return RequestOutcome(intent.op_id, intent.provider, "fulfilled", ("m-1", "m-2"))


def view(*open_ops: str) -> Any:
    facts = SimpleNamespace(
        open_ops=dict.fromkeys(open_ops), intents={"op-1": SimpleNamespace(intent=INTENT)}, open_returns={}
    )
    return SimpleNamespace(facts=facts)


def first_recovery(code: str) -> float:
    executor = Executor(code)

    async def main() -> float:
        ops = Operations(executor, EventLog(keep=100), LoopSettings(), wall=lambda: 0.0)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(ops.run)
            ops.recover(view(), {"p"}, CapacityState())  # the first cycle after the grant, before the intent
            action = RequestMachines("op-1", "p", "t", 2, "d")
            assert ops.dispatch((action,), {"p"}, {"p"}, view(), CapacityState(), 0.0) == []
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(40):  # a pass a second, as the loop's tick does
                await trio.sleep(1.0)
                ops.recover(view("op-1"), {"p"}, CapacityState())
                await trio.testing.wait_all_tasks_blocked()
                if executor.recovered:
                    break
            nursery.cancel_scope.cancel()
        return executor.recovered[0]

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_fact_that_could_not_be_committed_is_recovered_in_the_next_pass() -> None:
    assert first_recovery("commit_failed") == 1.0


@pytest.mark.parametrize("code", ["call_running", "list_failed", "provisioning_timeout"])
def test_other_unknown_outcomes_wait_recover_after(code: str) -> None:
    assert first_recovery(code) >= LoopSettings().recover_after
