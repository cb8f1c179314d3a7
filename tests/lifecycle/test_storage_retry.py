"""The instance facts of machines that exist are retried while the controller answers ``storage_failure`` (on
trio's ``MockClock``): once its disk is freed they go in at once; other failures, and a disk full for longer than
``STORAGE_RETRY_FOR``, are left to recovery."""

from __future__ import annotations

import hashlib

import trio
import trio.testing

from provisionerd.domain.errors import ControllerRejected, ControllerStorageFailure
from provisionerd.domain.model import NO_EPOCH, ProviderMachine, RequestIntent
from provisionerd.execution.steps import STORAGE_RETRY_FOR, FlowDeps, Steps
from provisionerd.execution.values import ExecutorSettings
from provisionerd.telemetry.events import EventLog


class Facts:
    """Refuses the first ``full`` commits with ``storage_failure`` (or ``error``), then takes them."""

    def __init__(self, full: int, error: Exception | None = None) -> None:
        self.full = full
        self.error = error
        self.tries: list[float] = []
        self.committed: list[object] = []

    def view(self) -> None:
        return None

    async def commit(self, fact: object) -> int:
        self.tries.append(trio.current_time())
        if len(self.tries) <= self.full:
            raise self.error or ControllerStorageFailure("InstanceFact not made durable: database or disk is full")
        self.committed.append(fact)
        return len(self.committed)


def steps(facts: Facts) -> Steps:
    settings = ExecutorSettings(cluster="c", controllers=("ctl:1",))
    return Steps(FlowDeps(settings, {}, None, facts, EventLog(None), lambda: 0.0))  # type: ignore[arg-type]


INTENT = RequestIntent("sim", NO_EPOCH, "op-1", "t", 1, ("op-1/0",), (hashlib.sha256(b"x").hexdigest(),))
MADE = [ProviderMachine("m-1", result="succeed", instance_ref="op-1/0")]


def run(facts: Facts) -> tuple[str, ...] | None:
    async def main() -> tuple[str, ...] | None:
        return await steps(facts).commit_instances(INTENT, MADE)

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_storage_failure_is_retried_until_the_disk_is_freed():
    facts = Facts(full=3)
    assert run(facts) == ("m-1",)
    assert [round(t, 3) for t in facts.tries] == [0.0, 1.0, 3.0, 7.0]  # 1, 2, 4 s apart
    assert len(facts.committed) == 1


def test_a_disk_full_for_too_long_is_left_to_recovery():
    facts = Facts(full=1000)
    assert run(facts) is None
    assert facts.committed == [] and facts.tries[-1] <= STORAGE_RETRY_FOR


def test_another_rejection_is_not_retried():
    facts = Facts(full=1, error=ControllerRejected("no_quorum"))
    assert run(facts) is None and len(facts.tries) == 1
