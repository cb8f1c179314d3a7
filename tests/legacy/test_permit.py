"""Each per-machine ``requestMachines`` of a legacy op is a mutation of its own: none starts after the lease that
admitted the op is gone (``domain.permit``; the simulation's legacy worlds, seeds 1708 and 178276053). The adapter
over an in-memory runner, MockClock."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import trio
import trio.testing

from provisionerd.domain.errors import LeaseError
from provisionerd.domain.permit import CURRENT_PERMIT
from provisionerd.provider.calls import Collected
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.journal import ACCEPTED, NOT_ISSUED
from provisionerd.provider.legacy.rules import UserDataTemplate
from provisionerd.provider.runtime import ProviderConfig

PER_MACHINE = UserDataTemplate({"token": "{join_token}"})


class Runner:
    """An LSF plugin that answers every call at once; ``calls`` counts the requestMachines it ran."""

    def __init__(self) -> None:
        self.name = "lsf"
        self.config = ProviderConfig("lsf", "clu", "/nonexistent")
        self.calls = 0

    def take_finished(self) -> list[Collected]:
        return []

    def pending_ops(self) -> set[str]:
        return set()

    async def take_op(self, op: str) -> list[Collected]:
        return []

    async def run_document(
        self,
        action: str,
        document: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        secrets: Collection[str] = (),
        partial: bytearray | None = None,
        key: str = "",
        op: str = "",
    ) -> Any:
        await trio.sleep(1.0)
        self.calls += 1
        return {"requestId": f"req-{self.calls}", "message": ""}


class Permit:
    def __init__(self, valid_for: int) -> None:
        self.asked = 0
        self.valid_for = valid_for

    def valid(self) -> bool:
        self.asked += 1
        return self.asked <= self.valid_for


TAGS = {
    "provisionerd:cluster": "clu",
    "provisionerd:provider": "lsf",
    "provisionerd:op": "op-2",
    "provisionerd:epoch": "1.1",
}


def request(n: int) -> dict[str, Any]:
    tags = {"provisionerd:cluster": "clu", "provisionerd:provider": "lsf", "provisionerd:op": "op-1"}
    return {
        "op_id": "op-1",
        "template": {"templateId": "t", "machineCount": n},
        "tags": {**tags, "provisionerd:epoch": "1.1"},
        "bootstrap": [
            {"instanceRef": f"op-1/{i}", "joinToken": f"tok{i:040d}", "controllers": ["ctl0:7400"]} for i in range(n)
        ],
    }


def run(permit: Permit | None, n: int = 3) -> tuple[Runner, LegacyProvider, dict[str, Any]]:
    runner = Runner()
    adapter = LegacyProvider(runner, LegacySettings(user_data=PER_MACHINE))

    async def main() -> dict[str, Any]:
        token = CURRENT_PERMIT.set(permit)
        try:
            return await adapter.call("requestMachines", request(n))
        finally:
            CURRENT_PERMIT.reset(token)

    answer = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return runner, adapter, answer


def test_no_call_after_the_first_once_the_lease_is_gone() -> None:
    # Asked as the call starts and before call 2: still held; before call 3: gone.
    runner, adapter, answer = run(Permit(valid_for=2))
    assert runner.calls == 2
    op = adapter.journal.creates["op-1"]
    assert [c.state for c in op.calls] == [ACCEPTED, ACCEPTED, NOT_ISSUED]
    assert "no longer held" in op.calls[2].detail
    assert answer["requestId"] == "lsf:op-1"


def test_every_call_while_the_lease_holds_and_without_a_permit() -> None:
    assert run(Permit(valid_for=99))[0].calls == 3
    assert run(None)[0].calls == 3


def test_no_call_at_all_when_the_lease_went_while_an_earlier_call_about_the_op_ran() -> None:
    """Seed 741612362 of the legacy worlds: a return admitted under one epoch waited for the call a killed process
    left running, and the lease had moved on by then. Neither mutation starts."""
    runner = Runner()
    adapter = LegacyProvider(runner, LegacySettings(user_data=PER_MACHINE))
    gone = Permit(valid_for=0)

    async def main() -> list[str]:
        token = CURRENT_PERMIT.set(gone)
        refused = []
        try:
            for action, document in (
                ("requestMachines", request(1)),
                (
                    "requestReturnMachines",
                    {"op_id": "op-2", "machines": [{"name": "h1", "machineId": "m1"}], "tags": TAGS},
                ),
            ):
                try:
                    await adapter.call(action, document)
                except LeaseError as exc:
                    refused.append(str(exc))
        finally:
            CURRENT_PERMIT.reset(token)
        return refused

    refused = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(refused) == 2 and all("lost while an earlier call ran" in r for r in refused)
    assert runner.calls == 0
