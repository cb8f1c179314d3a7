"""Orphan class ``license`` (d) through the orphan cycle on trio's MockClock: which plugins are asked, what the
controller's count decides, when a grant goes back (after ``orphan_grace``, never while in use), and what a plugin
answering garbage costs (a typed error, counted and logged, a bounded number of calls)."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio
import trio.testing
from cycle_world import NOW, PROVIDER, FakeExecutor, World
from rigs.clock import mock_run as run

from provisionerd.domain.model import OrphanReported
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.testing.fake_provider import FakeProvider

GRACE = 1800.0


class LicensedFake(FakeProvider):
    """The fake provider plus licence pools: ``pools`` is pool -> [granted, in use by the source, checked out]."""

    def __init__(self, *args: Any, declares: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.declares = declares
        self.pools: dict[str, list[Any]] = {}
        self.garbage: list[dict[str, Any]] = []  # answers to give instead, in order
        self.endless = False  # every page names a new next cursor

    def _describeProvider(self, doc):
        out = super()._describeProvider(doc)
        out["features"]["licensePools"] = self.declares
        return out

    def _listLicenses(self, doc):
        if self.garbage:
            return self.garbage.pop(0)
        if self.endless:
            n = int(doc.get("cursor", "0")) + 1
            return {"licenses": [{"pool": f"p{n}", "granted": 1, "inUse": 1, "checkedOut": 1}], "nextCursor": str(n)}
        grants = [{"pool": p, "granted": g, "inUse": u, "checkedOut": t} for p, (g, u, t) in sorted(self.pools.items())]
        return {"licenses": grants}

    def _returnLicenses(self, doc):
        for entry in doc["licenses"]:
            pool = self.pools[entry["pool"]]
            pool[0] -= min(entry["count"], pool[0] - pool[1])
        return {"requestId": f"lic-{doc['op_id']}"}


class LicenceExecutor(FakeExecutor):
    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.clients: dict[str, Any] = {}

    def client(self, provider: str) -> Any:
        return self.clients[provider]


def licensed_world(declares: bool = True) -> World:
    return World(provider=LicensedFake(PROVIDER, declares=declares))


def cycle_of(world: World, in_use: dict[str, int] | None, policy: OrphanPolicy | None = None):
    """A cycle whose controller says ``in_use`` per pool (``None``: it does not say)."""
    executor = LicenceExecutor(world)
    cycle = world.cycle(policy or OrphanPolicy(orphan_grace=GRACE), executor)
    executor.clients[PROVIDER] = cycle._client
    counts = {"now": in_use}
    cycle._read_controller = lambda: attrs.evolve(world.read_controller(), licenses_in_use=counts["now"])
    return cycle, executor, counts


def returned(world: World) -> list[dict[str, Any]]:
    return [d for a, d in world.provider.calls if a == "returnLicenses"]


def licence_findings(world: World) -> list[tuple[str, str, list[str]]]:
    return [
        (e["machine_id"], e["action"], e["blocked_by"])
        for e in world.kinds("orphan_detected")
        if e["orphan_class"] == "license"
    ]


def test_a_leaked_grant_is_reported_while_in_use_and_returned_after_grace_once_nothing_uses_it():
    world = licensed_world()
    world.provider.pools["matlab"] = [2, 0, NOW]  # checked out at t=0 on the cycle's wall clock
    cycle, executor, counts = cycle_of(world, {"matlab": 1})
    times = {}

    async def main():
        await cycle.run_pass()  # the controller counts a job on it: report only
        counts["now"] = {"matlab": 0}
        while not returned(world):
            await cycle.run_pass()
            await trio.sleep(100)
        times["returned"] = trio.current_time()
        await cycle.run_pass()  # the grant is back: the finding is resolved

    run(main)
    assert licence_findings(world)[:3] == [
        ("matlab", "report", []),
        ("matlab", "return", ["grace"]),
        ("matlab", "return", []),
    ]
    # One pass per 100 s from t~1: the first one past 1800 s of age acts, never an earlier one.
    assert GRACE <= times["returned"] < GRACE + 100 + 10
    report, fact = executor.facts  # the report while in use, then the return's record, committed before the call
    assert isinstance(fact, OrphanReported) and (fact.machine_id, fact.orphan_class) == ("matlab", "license")
    assert '"returnable":false' in report.evidence and '"returnable":true' in fact.evidence
    [sent] = returned(world)
    assert sent["licenses"] == [{"pool": "matlab", "count": 2}] and sent["op_id"] == fact.op_id
    assert sent["tags"]["provisionerd:op"] == fact.op_id
    [action] = [e for e in world.kinds("orphan_action") if e["action"] == "return"]
    assert action["outcome"] == "ok" and action["evidence"]["in_use"] == 0 and action["evidence"]["granted"] == 2
    assert action["answer"]["request_id"] == f"lic-{fact.op_id}"
    assert world.provider.pools["matlab"][0] == 0
    assert [e["machine_id"] for e in world.kinds("orphan_resolved")] == ["matlab"]


def test_never_returned_while_the_controller_counts_use_or_does_not_say():
    for in_use in ({"matlab": 1}, None, {}):
        world = licensed_world()
        world.provider.pools["matlab"] = [3, 0, NOW - 10 * GRACE]
        cycle, executor, _ = cycle_of(world, in_use)

        async def main(cycle=cycle):
            for _ in range(3):
                await cycle.run_pass()
                await trio.sleep(GRACE)

        run(main)
        assert returned(world) == [], in_use
        assert all('"returnable":false' in f.evidence for f in executor.facts), in_use
        events = [e for e in world.kinds("orphan_detected") if e["orphan_class"] == "license"]
        assert {e["action"] for e in events} == {"report"} and events[0]["evidence"]["idle"] == 3 - (in_use or {}).get(
            "matlab", 0
        ), in_use


def test_the_licence_source_still_counting_use_blocks_the_return():
    world = licensed_world()
    world.provider.pools["matlab"] = [3, 1, NOW - 10 * GRACE]
    cycle, executor, _ = cycle_of(world, {"matlab": 0})
    run(cycle.run_pass)
    assert returned(world) == [] and licence_findings(world) == [("matlab", "report", [])]


def test_a_plugin_that_does_not_declare_pools_is_never_asked():
    world = licensed_world(declares=False)
    world.provider.pools["matlab"] = [3, 0, NOW - 10 * GRACE]
    cycle, executor, _ = cycle_of(world, {"matlab": 0})

    async def main():
        for _ in range(3):
            await cycle.run_pass()

    run(main)
    asked = [a for a, _ in world.provider.calls]
    assert asked.count("describeProvider") == 1 and "listLicenses" not in asked
    assert [e["licenses"] for e in world.kinds("orphan_pass")] == [{"read": "no_pools"}] * 3
    assert licence_findings(world) == []


def test_garbage_is_a_typed_error_counted_logged_and_never_resolves_a_finding(caplog):
    world = licensed_world()
    world.provider.pools["matlab"] = [3, 0, NOW]
    cycle, executor, _ = cycle_of(world, {"matlab": 1})
    world.provider.garbage = [
        {"licenses": "not a list"},  # refused by the schema
        {"licenses": [{"pool": "matlab", "granted": 1, "inUse": 5, "checkedOut": 1}]},  # valid shape, contradicts
    ]

    world.provider.garbage, pending = [], world.provider.garbage

    async def first_then_garbage():
        await cycle.run_pass()
        world.provider.garbage = pending
        with caplog.at_level(logging.WARNING, logger="provisionerd.execution.orphan_licences"):
            await cycle.run_pass()
            await cycle.run_pass()

    run(first_then_garbage)
    passes = [e["licenses"] for e in world.kinds("orphan_pass")]
    assert passes[0] == {"read": "ok", "pools": 1}
    assert [p["read"] for p in passes[1:]] == ["unreadable", "unreadable"]
    assert "ProviderProtocolViolation" in passes[1]["reason"] and "ProviderAnswerInvalid" in passes[2]["reason"]
    assert dict(cycle.licenses.errors) == {"ProviderProtocolViolation": 1, "ProviderAnswerInvalid": 1}
    assert len([r for r in caplog.records if "licence pools of provider" in r.getMessage()]) == 2
    assert world.kinds("orphan_resolved") == []  # an unread source proves no grant went back
    assert returned(world) == []


def test_pages_that_never_end_are_refused_after_a_bounded_number_of_calls():
    world = licensed_world()
    world.provider.endless = True
    cycle, _, _ = cycle_of(world, {})
    run(cycle.run_pass)
    calls = [a for a, _ in world.provider.calls].count("listLicenses")
    [event] = world.kinds("orphan_pass")
    assert event["licenses"]["read"] == "unreadable" and "PagingViolation" in event["licenses"]["reason"]
    assert 1 < calls <= 100, calls
    assert dict(cycle.licenses.errors) == {"PagingViolation": 1}
