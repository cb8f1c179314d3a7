"""The loop reads the health windows back from the facts before its first plan (issue 35 item 2: "the windows
survive a daemon restart, rebuilt from the facts"; ``ReconcileLoop._read_windows``, ``planner.windows``), on
MockClock: a provider ``max_unhealthy`` protected before the restart stays protected after it; a read that fails or
takes too long leaves the windows empty, says so, and planning goes on."""

from __future__ import annotations

from typing import Any

import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.errors import LinkDown
from provisionerd.domain.model import NO_EPOCH, CommittedFact, ReturnIntent
from provisionerd.execution.loop import WINDOWS_READ_FOR
from provisionerd.planner.policy import Policy, ProviderPolicy

POLICY = Policy(
    cluster=CLUSTER,
    provisioning_timeout=600.0,
    join_deadline=900.0,
    providers={"p": ProviderPolicy(max_unhealthy=1, max_unhealthy_window=600.0)},
)
#: What the daemon before the restart committed 100 s earlier: three machines that never joined, returned.
BEFORE = [
    CommittedFact(
        40 + i, ReturnIntent("p", NO_EPOCH, f"{CLUSTER}:p:old:{i}", (f"m-old-{i}",), "never_joined"), BASE - 100
    )
    for i in range(3)
]


def scenario_with(reader: Any, seen: dict[str, Any]) -> Any:
    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 3))
        await trio.sleep(WINDOWS_READ_FOR + 30)
        seen["requests"] = rig.calls("p", "requestMachines")
        seen["restored"] = rig.events_of("windows_restored")
        seen["not_restored"] = rig.events_of("windows_not_restored")
        seen["asked"] = reader.asked

    return scenario


class Reader:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[tuple[str, ...], float, int]] = []

    async def __call__(self, providers: Any, since: float, last_index: int) -> list[CommittedFact]:
        self.asked.append((tuple(providers), since, last_index))
        if isinstance(self.answer, BaseException):
            raise self.answer
        if self.answer == "hang":
            await trio.sleep_forever()
        return list(self.answer)


def test_a_provider_protected_before_the_restart_is_protected_after_it(run_rig):
    seen: dict[str, Any] = {}
    reader = Reader(BEFORE)
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    run_rig(scenario_with(reader, seen), {"p": provider}, policy=POLICY, recent_facts=reader)
    assert len(seen["asked"]) == 1  # once a start
    providers, since, _ = seen["asked"][0]
    assert providers == ("p",) and since == BASE - 600.0  # the window's span back from the start (virtual 0)
    assert seen["requests"] == []  # 3 unhealthy within 600 s, more than max_unhealthy 1: no replacement
    (restored,) = seen["restored"]
    assert restored["unhealthy"] == 3 and restored["facts"] == 3


def test_without_the_windows_the_same_restart_replaces_them(run_rig):
    seen: dict[str, Any] = {}
    reader = Reader([])
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    run_rig(scenario_with(reader, seen), {"p": provider}, policy=POLICY, recent_facts=reader)
    assert len(seen["requests"]) == 1


def test_a_read_that_fails_or_hangs_leaves_them_empty_says_so_and_planning_goes_on(run_rig):
    for answer in (LinkDown("the link broke"), "hang"):
        seen: dict[str, Any] = {}
        reader = Reader(answer)
        provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
        run_rig(scenario_with(reader, seen), {"p": provider}, policy=POLICY, recent_facts=reader)
        (said,) = seen["not_restored"]
        assert ("LinkDown" if answer != "hang" else "TooSlowError") in said["reason"]
        assert len(seen["requests"]) == 1


def test_nothing_is_read_when_no_provider_has_a_window(run_rig):
    seen: dict[str, Any] = {}
    reader = Reader(BEFORE)
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    plain = Policy(cluster=CLUSTER, provisioning_timeout=600.0, join_deadline=900.0)
    run_rig(scenario_with(reader, seen), {"p": provider}, policy=plain, recent_facts=reader)
    assert seen["asked"] == [] and len(seen["requests"]) == 1
