"""``Plan.wake_at`` and ``planner.deadlines.next_deadline``: the loop may sleep until the deadline the plan names
without missing one (nothing new becomes due before it), and a deadline it names is one a plan then acts on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import CLUSTER, NOW, World, fuzz_settings, item, offer, snapshot

from provisionerd.domain.actions import FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus
from provisionerd.planner.capacity import Throttled
from provisionerd.planner.deadlines import PLAN_SLACK, next_deadline
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import PlannerState, observe

POLICY = Policy(
    cluster=CLUSTER,
    providers={
        "a": ProviderPolicy(join_deadline=100.0, idle_time=50.0, max_ttl=900.0, provisioning_timeout=400.0),
        "b": ProviderPolicy(join_deadline=300.0, idle_time=20.0, provisioning_timeout=200.0),
    },
)

machines = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.floats(0.0, 1000.0),  # launched this long before NOW
        st.one_of(st.none(), st.floats(0.0, 100.0)),  # not joined, or idle since this long before NOW
        st.booleans(),  # busy instead of idle
    ),
    max_size=12,
)


def _world(spec) -> World:
    world = World([offer("a", "t"), offer("b", "t")], policy=POLICY)
    for n, (provider, age, idle_for, busy) in enumerate(spec):
        refs_op = f"{CLUSTER}:{provider}:seed:{n}"
        world.commit_actions([RequestMachines(refs_op, provider, "t", 1, "d")])
        (machine_id,) = world.fulfil(refs_op, launch=NOW - age)
        if idle_for is not None:
            world.host(machine_id, HostStatus.BUSY if busy else HostStatus.IDLE, since=NOW - idle_for)
    return world


def _decisions(result) -> set[tuple[str, tuple[str, ...], str]]:
    found = set()
    for action in result.actions:
        match action:
            case ReturnMachines():
                found.add(("return", action.machine_ids, action.reason))
            case MarkLost():
                found.add(("lost", (action.machine_id,), action.reason))
            case FailRequest():
                found.add(("fail", (action.op_id,), action.reason))
    return found


@fuzz_settings(300)
@given(machines, st.integers(0, 3), st.floats(0.01, 0.99))
def test_nothing_becomes_due_before_the_plans_wake_at(spec, wanted, fraction):
    world = _world(spec)
    demand = snapshot(1, item("d", wanted, ncpus=1))
    state = world.state
    first = plan(state, demand, world.view, world.offers, world.hosts, NOW, POLICY)
    wake = first.wake_at
    assert wake is None or wake > NOW
    if wake is None:
        later = NOW + 10_000.0  # no deadline: nothing would become due ever, with the inputs unchanged
    else:
        later = NOW + (wake - NOW) * fraction
    again = plan(state, demand, world.view, world.offers, world.hosts, later, POLICY)
    assert _decisions(again) == _decisions(first)


def test_each_deadline_kind_is_named_and_acted_on_after_it():
    world = _world([("a", 10.0, None, False)])  # launched 10 s ago, not joined: join deadline in 90 s (a: 100 s)
    demand = snapshot(1, item("d", 0, ncpus=1))
    first = plan(world.state, demand, world.view, world.offers, world.hosts, NOW, POLICY)
    assert first.wake_at == NOW + 90.0
    after = plan(world.state, demand, world.view, world.offers, world.hosts, first.wake_at + PLAN_SLACK, POLICY)
    assert _decisions(after) == {("return", ("m00001",), "never_joined")}

    world = _world([("b", 500.0, 5.0, False)])  # idle 5 s, b's idle_time 20 s: due in 15 s
    first = plan(world.state, demand, world.view, world.offers, world.hosts, NOW, POLICY)
    assert first.wake_at == NOW + 15.0
    after = plan(world.state, demand, world.view, world.offers, world.hosts, first.wake_at + PLAN_SLACK, POLICY)
    assert _decisions(after) == {("return", ("m00001",), "idle")}

    world = _world([("a", 890.0, 1.0, False)])  # a's max_ttl 900 s: due in 10 s (idle_time 50 s: later)
    first = plan(world.state, snapshot(1, item("d", 1, ncpus=1)), world.view, world.offers, world.hosts, NOW, POLICY)
    assert first.wake_at == NOW + 10.0


def test_a_join_deadline_behind_a_machine_already_returning_is_still_found():
    # m00001 (launched 200 s ago) is past a's deadline and its return is in flight; m00002 is due in 50 s. The heap's
    # top is m00001, so the next deadline must be read past it.
    world = _world([("a", 200.0, None, False), ("a", 50.0, None, False)])
    demand = snapshot(1, item("d", 0, ncpus=1))
    first = world.plan(demand)
    assert _decisions(first) == {("return", ("m00001",), "never_joined")}
    assert first.wake_at == NOW + 50.0


def test_next_deadline_takes_the_earliest_of_the_plan_and_the_back_offs():
    state = PlannerState.initial("i")
    assert next_deadline(state, NOW) is None
    assert next_deadline(state, NOW, NOW + 30.0) == NOW + 30.0 + PLAN_SLACK
    throttled = observe(state, Throttled("a", NOW, jitter=1.0), POLICY).state  # a's throttle_base 2 s
    assert next_deadline(throttled, NOW, NOW + 30.0) == NOW + 2.0
    assert next_deadline(throttled, NOW + 5.0, NOW + 30.0) == NOW + 30.0 + PLAN_SLACK  # ended: not a deadline
