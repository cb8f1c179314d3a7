"""A request the controller refused (its intent never acknowledged, e.g. ``storage_failure``) leaves the step
window; one whose intent may be in the log (a broken link) stays counted. The storage-failure back-off has a low
ceiling, so demand follows the freeing of the controller's disk within one replan interval."""

from reconcile_world import CLUSTER, World, item, offer, snapshot

from provisionerd.planner.policy import Policy
from provisionerd.planner.state import (
    INTENT_BACKOFF_MAX,
    INTENT_BACKOFF_MAX_BY_REASON,
    IntentRefused,
    PlannerState,
    observe,
)


def world(**policy):
    return World([offer()], policy=Policy(cluster=CLUSTER, step_limit=3, step_interval=60.0, **policy))


def test_a_refused_intent_gives_its_steps_back():
    w = world()
    first = w.plan(snapshot(1, item("d", 10)))
    assert [a.count for a in first.actions] == [3]
    w.drop(first.actions[0].op_id, unacknowledged=True)
    assert w.state.step_log == ()
    again = w.plan(snapshot(1, item("d", 10)))
    assert [a.count for a in again.actions] == [3]  # at once, the window is empty again


def test_a_drop_whose_intent_may_be_committed_keeps_its_steps():
    w = world()
    first = w.plan(snapshot(1, item("d", 10)))
    w.drop(first.actions[0].op_id)
    assert sum(n for _, _, n in w.state.step_log) == 3
    assert w.plan(snapshot(1, item("d", 10))).actions == ()


def test_storage_failure_backs_off_with_a_low_ceiling():
    state, policy = PlannerState.initial(), Policy(cluster=CLUSTER)
    at, windows = 1000.0, []
    for _ in range(12):
        state = observe(state, IntentRefused("p", "storage_failure", at), policy).state
        windows.append(state.intent_backoff.until - at)
        at = state.intent_backoff.until
    ceiling = INTENT_BACKOFF_MAX_BY_REASON["storage_failure"]
    assert ceiling < 10.0 < INTENT_BACKOFF_MAX
    assert windows[:3] == [1.0, 2.0, 4.0] and max(windows) == ceiling
    other, windows = PlannerState.initial(), []
    for _ in range(12):
        other = observe(other, IntentRefused("p", "no_quorum", at), policy).state
        windows.append(other.intent_backoff.until - at)
        at = other.intent_backoff.until
    assert max(windows) == INTENT_BACKOFF_MAX  # other reasons keep the 30 s ceiling
