"""The health windows a restart lost, rebuilt from the facts and their commit times (issue 35 item 2,
``planner.windows``): ``max_unhealthy``'s log and the disruption budget's."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import CLUSTER, EPOCH, World, fuzz_settings, item, offer, snapshot
from test_health import BAD, gpu_item, join, protected_world, requests, returns

from provisionerd.domain.model import CommittedFact, DemandSnapshot, HostStatus, Lost, ReturnIntent
from provisionerd.planner import health, windows
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import PlannerState

NOW = 1_800_000_000.0


def at(index: int, fact: object, committed_at: float) -> CommittedFact:
    return CommittedFact(index, fact, committed_at)  # type: ignore[arg-type]


def timed(world: World, committed_at: float) -> list[CommittedFact]:
    """The world's facts, those without a time stamped ``committed_at`` (as the controller would have)."""
    return [c if c.committed_at else attrs.evolve(c, committed_at=committed_at) for c in world.facts]


def test_a_restarted_daemon_keeps_a_provider_protected_as_the_one_before_did() -> None:
    """A bad image: 3 machines short of their template, max_unhealthy 1. The daemon that found them stops
    replacing; one restarted a minute later would replace all 3 again from an empty log, unless it reads it back."""
    world = protected_world(max_unhealthy=1, max_unhealthy_window=600.0, capacity_backoff=1.0)
    first = world.plan(snapshot(1, gpu_item(3)))
    world.commit_actions(first.actions)
    for machine_id in [m for a in requests(first) for m in world.fulfil(a.op_id)]:
        join(world, machine_id, BAD)
    world.now += 1
    second = world.plan(snapshot(1, gpu_item(3)))
    assert requests(second) == [] and len(returns(second)) >= 1
    world.commit_actions(second.actions)
    facts = timed(world, world.now)
    for action in returns(second):
        world.returned(action)
    world.now += 60
    # The restart: a new planner state, the same facts.
    world.state = PlannerState.initial("i1")
    loss = world.plan(snapshot(2, gpu_item(3)))
    assert sum(a.count for a in requests(loss)) == 3  # the loss, shown
    for action in loss.actions:
        world.drop(action.op_id, unacknowledged=True)  # never sent: this restart did not happen
    world.state = windows.merged(PlannerState.initial("i2"), windows.rebuilt(facts, world.now, world.policy))
    third = world.plan(snapshot(3, gpu_item(3)))
    assert requests(third) == []
    (note,) = [n for n in third.notes if n.kind == "provider_protected"]
    assert "3 unhealthy machines within 600s, more than max_unhealthy 1" in note.detail
    # And it ends when it would have: 600 s after the findings.
    world.now += 540
    assert sum(a.count for a in requests(world.plan(snapshot(4, gpu_item(3))))) == 3


def test_a_restart_mid_drain_down_does_not_return_a_second_budget_at_once() -> None:
    """disruption_budget 2 per 60 s: 6 idle machines over the demand go 2 a minute, restart or not."""
    policy = Policy(
        cluster=CLUSTER,
        providers={"p": ProviderPolicy(disruption_budget=2, disruption_interval=60.0, idle_time=10.0)},
    )
    world = World([offer("p", "t")], policy=policy)
    first = world.plan(snapshot(1, item("d", 6)))
    world.commit_actions(first.actions)
    for action in requests(first):
        for machine_id in world.fulfil(action.op_id):
            world.host(machine_id, HostStatus.IDLE, since=world.now)
    world.now += 20
    down = world.plan(DemandSnapshot(2, ()))
    assert sum(len(r.machine_ids) for r in returns(down)) == 2
    world.commit_actions(down.actions)
    facts = timed(world, world.now)
    world.now += 5
    world.state = PlannerState.initial("i1")  # restarted: an empty window gives a second budget at once
    loss = world.plan(DemandSnapshot(3, ()))
    assert sum(len(r.machine_ids) for r in returns(loss)) == 2
    for action in loss.actions:
        world.drop(action.op_id)
    world.state = windows.merged(PlannerState.initial("i2"), windows.rebuilt(facts, world.now, world.policy))
    assert returns(world.plan(DemandSnapshot(4, ()))) == []
    world.now += 55  # the first two leave the window
    assert sum(len(r.machine_ids) for r in returns(world.plan(DemandSnapshot(5, ())))) == 2


def test_what_counts_and_what_does_not() -> None:
    own = ProviderPolicy(max_unhealthy=1, max_unhealthy_window=600.0, disruption_budget=5, disruption_interval=60.0)
    policy = Policy(cluster=CLUSTER, providers={"p": own})
    facts = [
        at(1, ReturnIntent("p", EPOCH, "r1", ("m1", "m2"), "capability_mismatch: ngpus 0 < 1 required"), NOW - 100),
        at(2, ReturnIntent("p", EPOCH, "r2", ("m3",), "never_joined"), NOW - 700),  # out of its window
        at(3, Lost("p", EPOCH, "l1", "m4", "reclaimed"), NOW - 10),
        at(4, ReturnIntent("p", EPOCH, "r3", ("m5", "m6", "m7"), "idle"), NOW - 30),
        at(5, ReturnIntent("p", EPOCH, "r4", ("m8",), "idle"), NOW - 61),  # out of the budget's interval
        at(6, ReturnIntent("p", EPOCH, "r5", ("m9",), "never_joined"), 0.0),  # no time: an older controller
        at(7, ReturnIntent("p", EPOCH, "r6", ("m10",), "provisioning_timeout"), NOW - 1),  # after ``before``
        at(8, ReturnIntent("p", EPOCH, "r7", ("m1",), "never_joined"), NOW - 50),  # m1 again: once
        at(9, ReturnIntent("p", EPOCH, "r8", ("m11",), "drained"), NOW - 5),  # neither kind
    ]
    found = windows.rebuilt(facts, NOW, policy, before=NOW - 2)
    assert found.unhealthy == ((NOW - 100, "p", "m1"), (NOW - 100, "p", "m2"), (NOW - 10, "p", "m4"))
    assert found.disruptions == ((NOW - 30, "p", 3),)
    assert windows.span(policy, ["p"]) == 600.0
    assert windows.span(Policy(cluster=CLUSTER), ["p"]) == 0.0  # no limit, no budget: nothing to read


@fuzz_settings(100)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["idle", "never_joined", "capability_mismatch: x", "max_ttl", "lost", "drained"]),
            st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=1, max_size=3, unique=True),
            st.floats(0, 2000),
        ),
        max_size=30,
    ),
    st.sampled_from([None, 1900.0]),
)
def test_the_rebuilt_logs_are_those_the_planner_keeps(entries, before) -> None:
    """Whatever the facts: each entry inside its provider's window, oldest first, a machine found once, and a
    merge with the running planner's own log keeps each machine once."""
    own = ProviderPolicy(max_unhealthy=1, max_unhealthy_window=500.0, disruption_budget=1, disruption_interval=300.0)
    policy = Policy(cluster=CLUSTER, providers={"p": own})
    now = NOW
    facts = []
    for i, (reason, machine_ids, age) in enumerate(entries, 1):
        fact = (
            Lost("p", EPOCH, f"o{i}", machine_ids[0], "reclaimed")
            if reason == "lost"
            else ReturnIntent("p", EPOCH, f"o{i}", tuple(machine_ids), reason)
        )
        facts.append(at(i, fact, now - age))
    found = windows.rebuilt(facts, now, policy, before=None if before is None else now - 2000 + before)
    assert list(found.unhealthy) == sorted(found.unhealthy)
    assert len({e[2] for e in found.unhealthy}) == len(found.unhealthy)
    assert all(now - e[0] < 500.0 for e in found.unhealthy)
    assert all(now - e[0] < 300.0 and e[2] >= 1 for e in found.disruptions)
    mine = PlannerState.initial("x")
    mine = attrs.evolve(mine, unhealthy=((now, "p", "m0"),))
    merged = windows.merged(mine, found)
    assert len({e[2] for e in merged.unhealthy}) == len(merged.unhealthy)
    assert health.unhealthy_count(merged.unhealthy, "p", now, 500.0) >= 1
