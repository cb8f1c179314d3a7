"""Adaptive scale-up (``provisionerd.planner.ramp``): the pure step under sequences of outcomes, and the planner
using it (a step that doubles per accepted round, halves on a refusal, between the floor and ``max_machines``)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisionerd.domain.model import DemandItem, DemandSnapshot, Offer, ResourceShape
from provisionerd.planner.capacity import CallSucceeded, CapacityUnavailable, Throttled
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.ramp import UNCAPPED, Accepted, Planned, Ramp, Refused, advance, changes, current
from provisionerd.planner.state import PlannerState, observe, ramp_step

ops = st.sampled_from([f"op{i}" for i in range(6)])
outcomes = st.one_of(
    st.builds(Planned, st.lists(ops, max_size=3).map(tuple), st.booleans()),
    st.builds(Accepted, ops),
    st.builds(Refused, st.sampled_from(["capacity_unavailable", "throttled"])),
)
floors = st.integers(1, 50)
caps = st.one_of(st.none(), st.integers(0, 5000))


@settings(max_examples=400, deadline=None)
@given(floors, caps, st.lists(outcomes, max_size=60))
def test_the_step_never_leaves_floor_and_cap_and_moves_only_as_the_outcome_says(floor, cap, sequence):
    high = max(floor, UNCAPPED if cap is None else cap)
    ramp: Ramp | None = None
    for outcome in sequence:
        before = current(ramp, floor, cap)
        ramp = advance(ramp, outcome, floor, cap)
        after = current(ramp, floor, cap)
        assert floor <= after <= high
        match outcome:
            case Planned():
                assert after == before  # planning never moves the step
            case Accepted():
                assert after in (before, min(high, 2 * before))  # monotone while succeeding: same or doubled
            case Refused():
                assert after in (before, max(floor, before // 2))  # never grows on a refusal: same or halved


@settings(max_examples=200, deadline=None)
@given(floors, caps, st.integers(1, 30))
def test_a_provider_that_keeps_accepting_saturated_rounds_doubles_each_round_up_to_its_cap(floor, cap, rounds):
    high = max(floor, UNCAPPED if cap is None else cap)
    ramp: Ramp | None = None
    for n in range(rounds):
        before = current(ramp, floor, cap)
        ramp = advance(ramp, Planned((f"r{n}",), True), floor, cap)
        ramp = advance(ramp, Accepted(f"r{n}"), floor, cap)
        assert current(ramp, floor, cap) == min(high, 2 * before)
    assert current(ramp, floor, cap) == min(high, floor * 2**rounds)


@settings(max_examples=200, deadline=None)
@given(floors, st.integers(1, 12), st.sampled_from(["capacity_unavailable", "throttled"]), st.integers(1, 5))
def test_a_refusal_halves_once_per_round_and_never_below_the_floor(floor, grown, reason, burst):
    cap = 10_000
    ramp: Ramp | None = None
    for n in range(grown):
        ramp = advance(advance(ramp, Planned((f"r{n}",), True), floor, cap), Accepted(f"r{n}"), floor, cap)
    step = current(ramp, floor, cap)
    for _ in range(burst):  # a burst of refusals from calls of one round: one halving
        ramp = advance(ramp, Refused(reason), floor, cap)
    assert current(ramp, floor, cap) == max(floor, step // 2)
    assert ramp is not None and ramp.reason == reason
    # A request asked under the halved step and refused too: halves again.
    ramp = advance(advance(ramp, Planned(("after",), False), floor, cap), Refused(reason), floor, cap)
    assert current(ramp, floor, cap) == max(floor, step // 4)


def test_acceptances_of_older_rounds_or_of_unsaturated_plans_do_not_double():
    ramp = advance(None, Planned(("a",), False), 10, 1000)
    assert current(advance(ramp, Accepted("a"), 10, 1000), 10, 1000) == 10  # demand below the step: no proof
    ramp = advance(advance(ramp, Planned(("b",), True), 10, 1000), Accepted("b"), 10, 1000)
    assert current(ramp, 10, 1000) == 20
    # "a" was asked under the old step (10): its acceptance proves nothing about 20.
    assert advance(ramp, Accepted("a"), 10, 1000) is ramp


def test_a_reload_that_moves_the_floor_or_the_cap_applies_at_once():
    ramp = Ramp(640)
    assert current(ramp, 10, 1000) == 640
    assert current(ramp, 10, 100) == 100  # cap lowered below the step
    assert current(ramp, 800, 1000) == 800  # floor raised above it
    assert current(ramp, 10, 0) == 10  # never below the floor (the cap of 0 blocks requests by itself)


def test_changes_names_old_new_and_reason_per_provider():
    old = {"p": Ramp(10)}
    new = {"p": Ramp(20, "accepted"), "q": Ramp(5, "throttled")}
    assert changes(old, new, {"p": (10, 100), "q": (5, 100)}) == [("p", 10, 20, "accepted")]


# --- the planner ------------------------------------------------------------------------------------------------

OFFER = Offer("p", "t", 5000, {"ncpus": ("Numeric", "2")})


def _policy(step: int = 10, cap: int | None = 1000) -> Policy:
    own = ProviderPolicy(step_limit=step, max_machines=cap)
    return Policy(cluster="c", step_limit=step, providers={"p": own})


def _requested(result) -> list[tuple[str, int]]:
    return [(a.op_id, a.count) for a in result.actions if type(a).__name__ == "RequestMachines"]


def test_the_planner_asks_for_a_demand_jump_in_doubling_rounds_and_halves_on_a_refusal():
    policy = _policy()
    state = PlannerState.initial("i")
    snapshot = DemandSnapshot(1, (DemandItem("d", ResourceShape(ncpus=2), 1000),))
    view = FactView()
    sizes = []
    now = 1000.0
    for _ in range(9):
        result = plan(state, snapshot, view, [OFFER], {}, now, policy)
        state = result.state
        asked = _requested(result)
        sizes.append(sum(n for _, n in asked))
        for op_id, _ in asked:  # the provider accepts at once (the intents are not committed: still pending)
            state = observe(state, CallSucceeded("p", op_id=op_id), policy).state
        now += 1.0
    # 10, then the doubled step's room each round (20 - 10, 40 - 20 ...), then the cap of 1,000 machines.
    assert sizes == [10, 10, 20, 40, 80, 160, 320, 360, 0]
    assert sum(sizes) == 1000 and ramp_step(state.ramps, "p", policy) == 1000
    state = observe(state, Throttled("p", now, jitter=0.0), policy).state
    assert ramp_step(state.ramps, "p", policy) == 500
    state = observe(state, CapacityUnavailable("p", "t", now), policy).state
    assert ramp_step(state.ramps, "p", policy) == 500  # the same round: no request asked since the halving


def test_without_the_ramp_the_step_limit_would_hold_the_jump_to_ten_per_window():
    # The check above must be able to fail: a provider with no acceptance stays at its floor.
    policy = _policy()
    state = PlannerState.initial("i")
    snapshot = DemandSnapshot(1, (DemandItem("d", ResourceShape(ncpus=2), 1000),))
    total = 0
    for n in range(5):
        result = plan(state, snapshot, FactView(), [OFFER], {}, 1000.0 + n, policy)
        state = result.state
        total += sum(c for _, c in _requested(result))
    assert total == 10 and ramp_step(state.ramps, "p", policy) == 10


@pytest.mark.parametrize("cap", [None, 15])
def test_a_provider_without_its_own_step_limit_is_not_ramped_and_a_cap_bounds_the_step(cap):
    plain = Policy(cluster="c", step_limit=10)
    state = observe(PlannerState.initial("i"), CallSucceeded("p", op_id="x"), plain).state
    assert state.ramps == {} and ramp_step(state.ramps, "p", plain) is None
    policy = _policy(cap=cap)
    ramps = {"p": attrs.evolve(Ramp(10), asked=("x",), saturated=True)}
    state = observe(attrs.evolve(PlannerState.initial("i"), ramps=ramps), CallSucceeded("p", op_id="x"), policy)
    assert ramp_step(state.state.ramps, "p", policy) == (20 if cap is None else 15)
