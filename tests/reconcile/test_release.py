"""Release on completion in the pure planner (issue 20 item 3): level-triggered, durable through the facts."""

from __future__ import annotations

import attrs
from reconcile_world import NOW, World, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.model import RELEASE_ON_COMPLETION, HostStatus
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.state import PlannerState


def reserved(demand_id: str, count: int, reservation: str, release: str = RELEASE_ON_COMPLETION):
    return attrs.evolve(item(demand_id, count, ncpus=2), reservation=reservation, release=release)


def world_with(*items) -> World:
    """Every item's machines made, joined and idle since NOW."""
    world = World([offer(max_number=100)])
    result = world.plan(snapshot(1, *items))
    world.commit_actions(result.actions)
    for action in result.actions:
        assert isinstance(action, RequestMachines)
        for machine_id in world.fulfil(action.op_id):
            world.host(machine_id, HostStatus.IDLE)
    world.now += 5
    assert world.plan(snapshot(1, *items)).actions == ()
    return world


def returns(result) -> list[ReturnMachines]:
    return [a for a in result.actions if isinstance(a, ReturnMachines)]


def test_the_request_carries_the_reservation_and_its_machines_go_back_once_it_leaves_the_demand() -> None:
    world = world_with(reserved("job", 2, "r1"), item("other", 1, ncpus=2))
    assert {(r.intent.reservation, r.intent.release) for r in world.view.intents.values()} == {
        ("r1", RELEASE_ON_COMPLETION),
        ("", ""),
    }
    result = world.plan(snapshot(2, item("other", 0, ncpus=2)))  # "other" is unneeded too, but idle only 5 s
    (released,) = returns(result)
    assert released.reason == "released" and sorted(released.machine_ids) == world.active("job")
    world.commit_actions(result.actions)
    assert returns(world.plan(snapshot(2, item("other", 0, ncpus=2)))) == []  # a replay plans nothing new


def test_a_reservation_still_named_by_another_item_is_not_released_and_no_snapshot_releases_nothing() -> None:
    world = world_with(reserved("job-a", 1, "r1"), reserved("job-b", 1, "r1"))
    assert returns(world.plan(snapshot(2, reserved("job-b", 1, "r1")))) == []  # r1 still running: idle_time rules
    assert returns(world.plan(None)) == []  # demand unknown (between a resync and its snapshot)
    (released,) = returns(world.plan(snapshot(3)))
    assert sorted(released.machine_ids) == world.active()


def test_a_lost_snapshot_delays_the_release_and_a_restarted_planner_releases_the_same_machines() -> None:
    world = world_with(reserved("job", 2, "r1"), item("other", 1, ncpus=2))
    job = world.active("job")
    # Snapshot 2 (which dropped the reservation) never arrived; snapshot 3 says the same: released then.
    world.now += 40
    (released,) = returns(world.plan(snapshot(3, item("other", 1, ncpus=2))))
    assert sorted(released.machine_ids) == job
    # A fresh daemon: a new planner state and a view rebuilt from the facts alone.
    view = FactView()
    for committed in world.facts:
        view.apply(committed)
    fresh = attrs.evolve(world, state=PlannerState.initial("i1"), view=view, hosts=dict(world.hosts), under_way={})
    (again,) = returns(fresh.plan(snapshot(3, item("other", 1, ncpus=2))))
    assert sorted(again.machine_ids) == job


def test_without_release_on_completion_the_machines_wait_for_idle_time_and_a_busy_one_waits_for_idle() -> None:
    world = world_with(reserved("job", 2, "r1", release=""), reserved("done", 2, "r2"))
    busy = world.active("done")[0]
    world.host(busy, HostStatus.BUSY)
    (released,) = returns(world.plan(snapshot(2)))
    assert released.machine_ids == (world.active("done")[1],)  # job's: after idle_time; the busy one: not yet
    world.commit_actions([released])
    world.host(busy, HostStatus.IDLE)
    (later,) = returns(world.plan(snapshot(2)))
    assert later.machine_ids == (busy,) and later.reason == "released"
    world.now = NOW + world.policy.idle_time + 1
    assert {a.reason for a in returns(world.plan(snapshot(2)))} == {"idle"}
