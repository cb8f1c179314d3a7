"""The orphan cycle's wiring on trio's MockClock: which reads it makes and in which order, what it hands the
executor, what it does when a view is unreadable, what it remembers between passes, and what it audits.

The classifier's per-precondition blocking is covered at the pure level in ``tests/orphans``; here each test
checks what reaches the executor, the provider and the audit stream."""

from __future__ import annotations

import json

import trio
import trio.testing
from cycle_world import CLUSTER, EPOCH, NOW, OLD, PROVIDER, World, tags
from rigs.clock import mock_run as run

from provisionerd.domain.errors import LeaseError, ProviderTimeout
from provisionerd.domain.model import TAG_CLUSTER, HostState, HostStatus, Lost, OrphanAdopted, OrphanReported
from provisionerd.orphans.model import orphan_op_id
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.provider.paging import LIST_PAGE_SIZE

TERMINATE = OrphanPolicy(orphan_action="terminate")


def busy_world() -> World:
    """A ghost fact, a tagged unknown machine, a never-joined machine known only by the op tag of an intent that
    was written off."""
    world = World()
    world.instance("i-ghost", "op-ghost")
    world.intent_only("op-nj-tag")
    world.machine("i-stray", tags("op-stray"))
    world.machine("i-crashed", tags("op-nj-tag"))
    return world


def test_an_unreadable_listing_skips_every_action_then_a_readable_one_acts():
    world = busy_world()
    world.provider.fail_next("listMachines", ProviderTimeout(PROVIDER, "listMachines", "no answer in 120s"))
    cycle = world.cycle(TERMINATE)
    seen = {}

    async def main():
        seen["skipped"] = await cycle.run_pass()
        seen["memory_after_skip"] = dict(cycle.memory.ghost_misses)
        seen["returns_after_skip"] = list(cycle.fake_executor.returns)
        seen["acted"] = await cycle.run_pass()

    run(main)
    skipped = seen["skipped"]
    assert skipped.classification.skipped == ("listing_unreadable",)
    assert skipped.actions == () and seen["returns_after_skip"] == []
    assert seen["memory_after_skip"] == {}  # an unread listing is neither a miss nor a find
    assert world.provider_actions()[0] == "listMachines"
    pass_event = world.kinds("orphan_pass")[0]
    assert "no answer in 120s" in pass_event["skipped"]["listing_unreadable"]
    # The same world, read: the tagged unknown is terminated and the crashed create returned; the ghost waits.
    returned = {r["machine_ids"] for r in cycle.fake_executor.returns}
    assert returned == {("i-stray",), ("i-crashed",)}
    assert [r.outcome for r in seen["acted"].actions] == ["ok", "ok"]
    assert dict(cycle.memory.ghost_misses) == {"i-ghost": 1}


def test_an_unreadable_controller_view_skips_every_action_and_is_read_after_the_listing():
    world = busy_world()
    world.view_down = "controller link is connecting: ctl0:7400: connection refused"
    cycle = world.cycle(TERMINATE)
    seen = {}

    async def main():
        seen["result"] = await cycle.run_pass()

    run(main)
    assert world.reads == ["listing", "view"]
    assert seen["result"].classification.skipped == ("view_unreadable",)
    assert seen["result"].actions == () and cycle.fake_executor.returns == [] and cycle.fake_executor.facts == []
    assert world.provider_actions() == ["listMachines"]
    assert "connection refused" in world.kinds("orphan_pass")[0]["skipped"]["view_unreadable"]


def test_a_ghost_is_retired_on_its_second_miss_through_the_executor_with_the_lease_epoch():
    world = World().instance("i-ghost", "op-ghost")
    cycle = world.cycle()
    seen = {}

    async def main():
        seen["first"] = await cycle.run_pass()
        await trio.sleep(60)
        seen["second"] = await cycle.run_pass()

    run(main)
    assert seen["first"].actions == ()
    executor = cycle.fake_executor
    assert executor.facts == [
        Lost(
            PROVIDER,
            EPOCH,
            orphan_op_id(PROVIDER, "ghost", "i-ghost", "retire"),
            "i-ghost",
            "ghost: not found in consecutive listings",
        )
    ]
    assert executor.planned_epochs == [EPOCH]  # stamped by the cycle with the epoch it observed
    (event,) = world.kinds("orphan_action")
    assert event["action"] == "retire" and event["outcome"] == "ok" and event["epoch"] == EPOCH
    assert event["evidence"]["not_found_reads"] == 2 and event["evidence"]["epoch"] == str(EPOCH)
    assert event["answer"] == {"fact_index": 3}
    assert event["confirmed_by"]["by"] == "automatic" and event["confirmed_by"]["identity"] == "prov-1"
    assert "ghost_confirmations" in event["confirmed_by"]["rule"]
    assert world.provider_actions() == ["listMachines", "listMachines"]  # retiring a fact calls no provider


def test_a_tagged_unknown_machine_is_terminated_through_the_executor_and_audited_with_its_evidence():
    world = World().machine("i-stray", tags("op-stray"))
    cycle = world.cycle(TERMINATE)
    run(cycle.run_pass)
    (call,) = cycle.fake_executor.returns
    assert call == {
        "provider": PROVIDER,
        "op_id": orphan_op_id(PROVIDER, "tagged_unknown", "i-stray", "terminate"),
        "machine_ids": ("i-stray",),
        "reason": "orphan tagged_unknown: terminate",
        "stop": False,
        "epoch": EPOCH,
    }
    assert world.provider_actions() == ["listMachines", "requestReturnMachines"]
    (event,) = world.kinds("orphan_action")
    assert event["evidence"]["tags"] == tags("op-stray") and event["evidence"]["launch_time"] == OLD
    assert event["evidence"]["age"] >= 4000 and event["epoch"] == EPOCH
    assert event["answer"]["status"] == "returned" and event["answer"]["returned"] == ["i-stray"]
    assert event["confirmed_by"]["preconditions"] == [
        "listing_read",
        "view_read",
        "lease_epoch",
        "primary",
        "settled",
        "owner_tags",
    ]


def test_stop_uses_stop_machines_and_adopt_commits_a_fact_without_calling_the_provider():
    world = World().machine("i-stray", tags("op-stray")).machine("i-known", tags("op-x"), name="node7")
    world.hosts.append(HostState("", PROVIDER, "", HostStatus.IDLE, NOW - 5, hostname="node7"))
    cycle = world.cycle(OrphanPolicy(orphan_action="stop"))
    run(cycle.run_pass)
    assert [(r["machine_ids"], r["stop"]) for r in cycle.fake_executor.returns] == [(("i-stray",), True)]
    (adopted,) = cycle.fake_executor.facts
    assert isinstance(adopted, OrphanAdopted) and adopted.machine_id == "i-known" and adopted.hostname == "node7"
    assert adopted.epoch == EPOCH


def test_failed_cleanups_open_the_breaker_and_a_gate_refusal_does_not_count():
    world = World().machine("i-stray", tags("op-stray"))
    cycle = world.cycle(OrphanPolicy(orphan_action="terminate", breaker_max_failures=2))
    executor = cycle.fake_executor
    executor.statuses.extend(["rejected", "unknown"])
    outcomes = []

    async def main():
        for _ in range(3):
            result = await cycle.run_pass()
            outcomes.append([r.outcome for r in result.actions])
            await trio.sleep(60)

    run(main)
    assert outcomes == [["failed"], ["failed"], []]  # the third pass: breaker open, nothing tried
    assert cycle.memory.failed_cleanups == 2
    last = world.kinds("orphan_pass")[-1]
    assert last["breaker"]["open"] and last["breaker"]["reasons"] == ["failed_cleanups"]
    assert [e["failed_cleanups"] for e in world.kinds("orphan_action")] == [1, 2]


def test_a_gate_refusal_ends_the_pass_and_is_not_a_failed_cleanup():
    world = World().instance("i-g1", "op-1").instance("i-g2", "op-2")
    cycle = world.cycle()
    cycle.fake_executor.commit_errors.append(LeaseError(PROVIDER, "local deadline passed"))
    seen = {}

    async def main():
        await cycle.run_pass()
        seen["result"] = await cycle.run_pass()

    run(main)
    assert [r.outcome for r in seen["result"].actions] == ["refused"]  # the second ghost was not tried
    assert cycle.fake_executor.facts == [] and cycle.memory.failed_cleanups == 0
    (event,) = world.kinds("orphan_action")
    assert event["outcome"] == "refused" and event["answer"]["error"] == "LeaseError"


def test_never_joined_machines_have_one_owner_each():
    world = World().instance("i-nj", "op-nj").machine("i-nj", tags("op-nj"))  # fact: the reconciler's
    world.intent_only("op-open", failed=False).machine("i-late", tags("op-open"))  # open intent: the executor's
    world.intent_only("op-written-off").machine("i-crashed", tags("op-written-off"))  # closed intent: ours
    cycle = world.cycle()
    seen = {}

    async def main():
        seen["result"] = await cycle.run_pass()

    run(main)
    owners = {f.machine_id: (f.orphan_class, f.action, f.evidence["returned_by"]) for f in seen["result"].findings}
    assert owners == {
        "i-nj": ("never_joined", "return", "reconciler"),
        "i-late": ("never_joined", "return", "executor"),
        "i-crashed": ("never_joined", "return", "orphan_cycle"),
    }
    assert [r["machine_ids"] for r in cycle.fake_executor.returns] == [("i-crashed",)]


def test_untagged_foreign_and_protected_machines_are_never_touched():
    world = World()
    world.machine("i-untagged", {})
    world.machine("i-cluster-only", {TAG_CLUSTER: CLUSTER})
    world.machine("i-foreign", {**tags(), TAG_CLUSTER: "someone-else"})
    world.machine("i-protected", tags(**{"provisionerd:protect": "yes"}))
    cycle = world.cycle(TERMINATE)
    seen = {}

    async def main():
        for _ in range(3):
            seen["last"] = await cycle.run_pass()
            await trio.sleep(60)

    run(main)
    assert cycle.fake_executor.returns == [] and cycle.fake_executor.facts == []
    assert set(world.provider_actions()) == {"listMachines"}
    (finding,) = seen["last"].findings
    assert finding.machine_id == "i-protected" and "protected" in finding.blocked_by
    # the listing asks for this cluster, one page at a time
    assert world.provider.calls[0][1] == {"tags": {TAG_CLUSTER: CLUSTER}, "pageSize": LIST_PAGE_SIZE}


def test_detections_are_audited_when_new_or_changed_and_resolved_when_gone():
    world = World().machine("i-stray", tags("op-stray"))
    cycle = world.cycle()  # report only

    async def main():
        await cycle.run_pass()  # detected, reported (an OrphanReported fact)
        await trio.sleep(60)
        await cycle.run_pass()  # already reported: its blockers changed
        await trio.sleep(60)
        await cycle.run_pass()  # nothing changed: no new detection event
        del world.provider.machines["i-stray"]
        await trio.sleep(60)
        await cycle.run_pass()

    run(main)
    detected = [(e["machine_id"], e["action"], e["blocked_by"]) for e in world.kinds("orphan_detected")]
    assert detected == [("i-stray", "report", []), ("i-stray", "report", ["already_reported"])]
    assert [e["machine_id"] for e in world.kinds("orphan_resolved")] == ["i-stray"]
    (report,) = cycle.fake_executor.facts
    assert isinstance(report, OrphanReported) and json.loads(report.evidence)["tags"] == tags("op-stray")


def test_run_makes_one_pass_per_interval_on_trios_clock_and_audit_holds_no_secret():
    world = World()
    token = "join-token-that-must-never-be-logged-0123456789"
    seen = {}

    async def main():
        await world.provider.call(
            "requestMachines",
            {
                "template": {"templateId": "small", "machineCount": 1},
                "op_id": "op-new",
                "tags": tags("op-new"),
                "bootstrap": [{"instanceRef": "clu/op-new/0", "controllers": ["ctl:1"], "joinToken": token}],
            },
        )
        cycle = world.cycle(TERMINATE)
        async with trio.open_nursery() as nursery:
            await nursery.start(cycle.run, 60.0)
            await trio.sleep(250)
            nursery.cancel_scope.cancel()
        seen["passes"] = cycle.passes

    run(main)
    assert seen["passes"] == 5
    starts = [round(e["mono"]) for e in world.kinds("orphan_pass")]
    assert starts[:2] == [0, 62]  # the first pass terminates the stray (2 s in the executor), then sleeps 60 s
    assert token not in json.dumps(list(world.events.recent), default=str)
