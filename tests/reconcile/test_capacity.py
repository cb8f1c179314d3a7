"""Policy validation and the provider back-off memory fed by observations."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import fuzz_settings

from provisionerd.domain.errors import ConfigError
from provisionerd.planner.capacity import (
    CallSucceeded,
    CapacityUnavailable,
    ProviderResumed,
    ProviderUnhealthy,
    Throttled,
)
from provisionerd.planner.in_flight import PendingRequest
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import ActionDropped, PlannerState, Reclaimed, SnapshotSeqReset, observe

POLICY = Policy(cluster="c1")


def test_policy_defaults_match_the_issue():
    assert POLICY.join_deadline == 900.0 and POLICY.capacity_backoff == 180.0


def test_policy_reports_every_bad_knob():
    with pytest.raises(ConfigError) as caught:
        Policy(
            cluster="a:b",
            join_deadline=0,
            idle_time=float("nan"),
            max_ttl=-1,
            step_limit=0,
            provider_caps={"p": -1},
            return_batch=True,
        )
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "cluster",
        "join_deadline",
        "idle_time",
        "max_ttl",
        "step_limit",
        "return_batch",
        "provider_caps.p",
    ]


def test_capacity_unavailable_blocks_the_offer_for_the_backoff():
    state = observe(PlannerState(), CapacityUnavailable("p", "t", 100.0), POLICY)
    assert state.notes[0].kind == "offer_unavailable"
    capacity = state.state.capacity
    assert capacity.offer_block(("p", "t"), 279.9) == "capacity_unavailable until 280.0"
    assert capacity.offer_block(("p", "t"), 280.0) is None
    assert capacity.offer_block(("p", "other"), 200.0) is None
    assert capacity.pruned(280.0).unavailable == {}


def test_refusals_in_a_row_double_the_backoff_up_to_8x_and_a_quiet_spell_forgets_them():
    """A refused offer asked again as soon as its back-off ended (a better priority each time the step window freed
    room) is refused again: each refusal in a row doubles the back-off, so the offer behind it gets its turn."""
    state, at, ends = PlannerState(), 100.0, []
    for _ in range(5):
        state = observe(state, CapacityUnavailable("p", "t", at), POLICY).state
        until = state.capacity.unavailable[("p", "t")]
        ends.append(until - at)
        at = until + 1.0  # asked again just after the back-off ended
        state = attrs.evolve(state, capacity=state.capacity.pruned(at))
    assert ends == [180.0, 360.0, 720.0, 1440.0, 1440.0]
    # A quiet spell as long as the last back-off after its end: the next refusal is a first one again.
    quiet = at + 1440.0
    state = attrs.evolve(state, capacity=state.capacity.pruned(quiet))
    assert state.capacity.refusals == {}
    state = observe(state, CapacityUnavailable("p", "t", quiet), POLICY).state
    assert state.capacity.unavailable[("p", "t")] == quiet + 180.0
    # Another offer of the same provider keeps its own count.
    assert observe(state, CapacityUnavailable("p", "u", quiet), POLICY).state.capacity.refusals[("p", "u")][0] == 1


def test_quota_makes_the_provider_unhealthy_until_resumed_or_probed():
    paused = observe(PlannerState(), ProviderUnhealthy("p", "quota_exceeded", 0.0, "vcpu limit"), POLICY)
    assert paused.notes[0].kind == "provider_unhealthy" and "vcpu limit" in paused.notes[0].detail
    capacity = paused.state.capacity
    assert "unhealthy (quota_exceeded: vcpu limit)" in capacity.offer_block(("p", "any"), 10.0)
    assert capacity.offer_block(("q", "any"), 10.0) is None
    assert not capacity.probe_due("p", POLICY.quota_pause - 0.1) and capacity.probe_due("p", POLICY.quota_pause)
    # Past the first step it is still unhealthy: only a probe (or an operator) makes it healthy again.
    assert capacity.offer_block(("p", "any"), POLICY.quota_pause) is not None
    resumed = observe(paused.state, ProviderResumed("p"), POLICY)
    assert resumed.notes[0].kind == "provider_healthy"
    assert resumed.state.capacity.offer_block(("p", "any"), 10.0) is None
    assert observe(resumed.state, ProviderResumed("p"), POLICY).state == resumed.state


def test_throttle_backs_off_exponentially_with_jitter_and_success_resets():
    state = PlannerState()
    ends = []
    for _ in range(4):
        state = observe(state, Throttled("p", 0.0, jitter=1.0), POLICY).state
        ends.append(state.capacity.throttles["p"].until)
    assert ends == [2.0, 4.0, 8.0, 16.0]
    half = observe(PlannerState(), Throttled("p", 0.0, jitter=0.0), POLICY).state
    assert half.capacity.throttles["p"].until == 1.0
    assert state.capacity.offer_block(("p", "t"), 15.0) == "provider 'p' throttled until 16.0"
    reset = observe(state, CallSucceeded("p"), POLICY).state
    assert "p" not in reset.capacity.throttles
    again = observe(reset, Throttled("p", 100.0, jitter=1.0), POLICY).state
    assert again.capacity.throttles["p"].until == 102.0


@fuzz_settings(100)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_seeded_jitter_is_deterministic_and_bounded(seed, throttles):
    policy = Policy(cluster="c1", throttle_base=1.0, throttle_max=60.0)
    runs = []
    for _ in range(2):
        state = PlannerState.initial("i", jitter_seed=seed)
        at = 0.0
        for n in range(1, throttles + 1):
            state = observe(state, Throttled("p", at), policy).state
            delay = min(60.0, 2.0 ** (n - 1))
            until = state.capacity.throttles["p"].until
            assert at + delay / 2 <= until <= at + delay
            at = until  # the next throttle comes when the back-off ends
        runs.append(state)
    assert runs[0] == runs[1]


def test_observation_inputs_are_checked():
    with pytest.raises(ValueError, match="jitter"):
        observe(PlannerState(), Throttled("p", 0.0, jitter=2.0), POLICY)
    with pytest.raises(ValueError, match="finite"):
        observe(PlannerState(), CapacityUnavailable("p", "t", float("inf")), POLICY)
    with pytest.raises(TypeError):
        observe(PlannerState(), "nonsense", POLICY)
    with pytest.raises(ValueError, match="incarnation"):
        PlannerState.initial("a:b")


def test_action_dropped_touches_only_the_step_window_and_only_for_an_unacknowledged_planned_request():
    """The op book, not the planner, keeps what is in flight: a drop changes the planner's state only when the
    controller took no intent for a request this process planned (its machines leave the step window)."""
    state = PlannerState(step_log=((5.0, "p", 3), (5.0, "q", 1), (9.0, "p", 2)))
    assert observe(state, ActionDropped("x1"), POLICY).state == state
    assert observe(state, ActionDropped("x1", unacknowledged=True), POLICY).state == state  # not planned here
    request = PendingRequest("p", "t", "d", 2, 5.0)
    assert observe(state, ActionDropped("r1", False, request), POLICY).state == state  # may be committed: kept
    released = observe(state, ActionDropped("r1", True, request), POLICY).state
    assert released.step_log == ((5.0, "p", 1), (5.0, "q", 1), (9.0, "p", 2))


def test_reclaim_and_seq_reset():
    state = observe(PlannerState(applied_seq=9), Reclaimed("p", ("m1", "m2"), 5.0), POLICY).state
    assert set(state.reclaimed) == {"m1", "m2"} and state.reclaimed["m1"].at == 5.0
    state = observe(state, Reclaimed("p", ("m1",), 50.0), POLICY).state
    assert state.reclaimed["m1"].at == 5.0  # the first notice counts
    assert observe(state, SnapshotSeqReset(), POLICY).state.applied_seq == -1
