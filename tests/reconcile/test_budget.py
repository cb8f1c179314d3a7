"""The disruption budget in the pure planner (issue 20 item 5): voluntary returns paced per provider and interval,
involuntary ones never held back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import CLUSTER, NOW, World, fuzz_settings, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.model import RELEASE_ON_COMPLETION, DemandItem, HostStatus, ResourceShape
from provisionerd.planner import budget
from provisionerd.planner.policy import Policy, ProviderPolicy

INTERVAL = 60.0


def paced(**own) -> Policy:
    knobs = {"idle_time": 1.0, "disruption_interval": INTERVAL, **own}
    return Policy(cluster=CLUSTER, providers={"p": ProviderPolicy(**knobs)})


def fleet(count: int, policy: Policy, *, join: bool = True) -> World:
    world = World([offer(max_number=1000)], policy=policy)
    result = world.plan(snapshot(1, item("d", count)))
    world.commit_actions(result.actions)
    for action in result.actions:
        assert isinstance(action, RequestMachines)
        for machine_id in world.fulfil(action.op_id):
            if join:
                world.host(machine_id, HostStatus.IDLE)
    return world


def returned(world: World, snap) -> list[ReturnMachines]:
    """Plan, commit the returns, and confirm them (the machines are gone)."""
    result = world.plan(snap)
    returns = [a for a in result.actions if isinstance(a, ReturnMachines)]
    world.commit_actions(returns)
    for action in returns:
        world.returned(action)
    return returns


def test_a_budget_of_two_per_interval_returns_ten_idle_machines_two_per_interval() -> None:
    world = fleet(10, paced(disruption_budget=2))
    world.now += 10  # all idle for 10 s, idle_time 1 s: all ten are due now
    per_interval = []
    wakes = []
    for _ in range(6):
        returns = returned(world, snapshot(2))
        per_interval.append(sum(len(r.machine_ids) for r in returns))
        assert {r.reason for r in returns} <= {"idle"}
        world.now += 30  # half an interval: nothing more
        result = world.plan(snapshot(2))
        assert not [a for a in result.actions if isinstance(a, ReturnMachines)]
        wakes.append(result.wake_at)
        world.now += 30
    assert per_interval == [2, 2, 2, 2, 2, 0]
    assert wakes[0] == NOW + 10 + INTERVAL  # the plan wakes when the window frees room
    assert world.active() == []


def test_never_joined_machines_are_returned_at_once_whatever_the_budget() -> None:
    policy = paced(disruption_budget=0, join_deadline=100.0)
    world = fleet(10, policy, join=False)
    world.now += 101
    (returns,) = returned(world, snapshot(2))
    assert returns.reason == "never_joined" and len(returns.machine_ids) == 10


def test_a_percent_budget_rounds_up_and_the_smaller_limit_binds() -> None:
    assert budget.allowance(ProviderPolicy(disruption_budget_percent=10.0), 25) == 3
    assert budget.allowance(ProviderPolicy(disruption_budget_percent=10.0, disruption_budget=2), 25) == 2
    assert budget.allowance(ProviderPolicy(), 25) is None
    world = fleet(20, paced(disruption_budget_percent=10.0))
    world.now += 10
    assert sum(len(r.machine_ids) for r in returned(world, snapshot(2))) == 2  # 10% of 20


def test_no_budget_returns_everything_at_once() -> None:
    world = fleet(10, paced())
    world.now += 10
    assert sum(len(r.machine_ids) for r in returned(world, snapshot(2))) == 10


@fuzz_settings(60)
@given(
    limit=st.integers(0, 4),
    machines=st.integers(1, 12),
    steps=st.lists(st.floats(1.0, 90.0), min_size=1, max_size=12),
    lost=st.integers(0, 3),
)
def test_no_window_ever_holds_more_voluntary_returns_than_the_budget(limit, machines, steps, lost) -> None:
    world = fleet(machines, paced(disruption_budget=limit, join_deadline=50.0))
    for machine_id in world.active()[:lost]:  # some never join: involuntary, never counted
        world.hosts.pop(world.view.machines[machine_id].instance_ref)
    log: list[tuple[float, int]] = []
    for step in steps:
        world.now += step
        for r in returned(world, snapshot(2, item("d", 0))):
            if r.reason in budget.VOLUNTARY:
                log.append((world.now, len(r.machine_ids)))
    for at, _ in log:
        assert sum(n for t, n in log if at <= t < at + INTERVAL) <= limit


def two_items(first: str, policy: Policy, *, release: str = "idle") -> World:
    """Items ``a`` (4 CPUs: the cheaper template ``t1``) and ``b`` (8 CPUs: only ``t2``) of one provider, three
    machines each, requested and made item ``first`` first; ``b``'s went idle 400 s before ``a``'s."""
    world = World([offer(template="t1", ncpus=4, price=0.1), offer(template="t2", ncpus=8, price=0.2)], policy=policy)
    items = {
        "a": DemandItem("a", ResourceShape(ncpus=4), 3, reservation="ra", release=release),
        "b": DemandItem("b", ResourceShape(ncpus=8), 3, reservation="rb", release=release),
    }
    second = "b" if first == "a" else "a"
    for seq, demand_id in enumerate((first, second), start=1):
        result = world.plan(snapshot(seq, *(items[d] for d in sorted(items) if d in (first, demand_id))))
        requests = [a for a in result.actions if isinstance(a, RequestMachines)]
        assert [(r.demand_id, r.count) for r in requests] == [(demand_id, 3)]
        world.commit_actions(requests)
        for machine_id in world.fulfil(requests[0].op_id):
            world.host(machine_id, HostStatus.IDLE, since=NOW - (100 if demand_id == "a" else 500))
    return world


def test_idle_returns_under_a_budget_go_longest_idle_first_across_the_providers_templates() -> None:
    world = two_items("a", paced(disruption_budget=2, idle_time=50.0))
    (returns,) = returned(world, snapshot(3))  # neither item wanted any more: six machines due, two may go
    made_for = {m: world.view.machines[m].demand_id for m in returns.machine_ids}
    assert returns.reason == "idle" and set(made_for.values()) == {"b"}  # idle 500 s, not a's 100 s


def test_which_released_machines_a_budget_lets_go_does_not_depend_on_which_item_was_made_first() -> None:
    chosen = []
    for first in ("a", "b"):
        world = two_items(first, paced(disruption_budget=2), release=RELEASE_ON_COMPLETION)
        (returns,) = returned(world, snapshot(3))  # both reservations completed
        assert returns.reason == "released"
        chosen.append(sorted(world.view.machines[m].demand_id for m in returns.machine_ids))
    assert chosen[0] == chosen[1] == ["a", "a"]  # demand_id order, whatever the facts' order
