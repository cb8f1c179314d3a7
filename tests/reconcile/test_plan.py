"""The planner, one rule at a time, on small worlds with exact actions."""

import pytest
from reconcile_world import CLUSTER, EPOCH, NOW, World, item, offer, snapshot

from provisionerd.domain.actions import FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus, OrphanAdopted, PriceQuote, RequestFailed
from provisionerd.planner.capacity import CapacityUnavailable, ProviderUnhealthy, Throttled
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import PlannerState, Reclaimed, SnapshotSeqReset, observe

#: The quote of reconcile_world.offer's default price, which each request carries for its intent and facts.
QUOTE = PriceQuote(0.1, "USD", "hour", "test", "2026-01-01T00:00:00Z")


def world(*offers, **policy):
    return World(list(offers) or [offer()], policy=Policy(cluster=CLUSTER, **policy))


def kinds(actions):
    return [type(a).__name__ for a in actions]


def running(w, snap, n=None):
    """Plan, commit, fulfil and join (busy) everything the plan requested."""
    result = w.plan(snap)
    w.commit_actions(result.actions)
    made = []
    for action in result.actions:
        if isinstance(action, RequestMachines):
            made += w.fulfil(action.op_id)
    for machine_id in made:
        w.host(machine_id, HostStatus.BUSY)
    return made


def test_demand_is_requested_once_from_the_cheapest_offer():
    w = world(offer("p", "dear", price=0.5), offer("p", "cheap", price=0.1))
    snap = snapshot(1, item("d", 3))
    first = w.plan(snap)
    assert first.actions == (RequestMachines("c1:p:i0:0", "p", "cheap", 3, "d", price=QUOTE),)
    assert first.decisions[0].requested == ((("p", "cheap"), 3),)
    assert w.plan(snap).actions == ()  # replay before the intent is committed: in flight, nothing new
    w.commit_actions(first.actions)
    assert w.plan(snap).actions == ()  # the intent's outstanding machines count
    w.fulfil("c1:p:i0:0", 2)
    assert w.plan(snap).actions == ()
    w.fulfil("c1:p:i0:0")
    assert w.plan(snap).actions == ()
    assert w.in_flight.unseen(w.view)[0].requests == {}  # the facts show it: no longer counted as in flight
    more = w.plan(snapshot(2, item("d", 5)))
    assert more.actions == (RequestMachines("c1:p:i0:1", "p", "cheap", 2, "d", price=QUOTE),)


def test_stale_snapshot_plans_nothing_and_says_so():
    w = world()
    w.plan(snapshot(5, item("d", 1)))
    before = w.state
    stale = w.plan(snapshot(4, item("d", 9)))
    assert stale.actions == () and stale.state == before
    assert [n.kind for n in stale.notes] == ["stale_snapshot"]
    # after a controller failover the resync may restart numbering
    w.state = observe(w.state, SnapshotSeqReset(), w.policy).state
    assert kinds(w.plan(snapshot(1, item("d", 3))).actions) == ["RequestMachines"]


def test_op_ids_skip_ones_already_in_the_facts_after_a_restart():
    w = world()
    w.commit_actions(w.plan(snapshot(1, item("d", 1))).actions)
    w.state = PlannerState.initial("i0")  # a restart that reused its incarnation: the facts still guard
    result = w.plan(snapshot(1, item("d", 2)))
    assert result.actions == (RequestMachines("c1:p:i0:1", "p", "t", 1, "d", price=QUOTE),)


def test_capacity_error_falls_to_the_next_offer_then_returns_after_the_window():
    w = world(offer("p", "cheap", price=0.1), offer("q", "dear", price=0.2))
    snap = snapshot(1, item("d", 2))
    first = w.plan(snap)
    w.commit_actions(first.actions)
    (request,) = first.actions
    # the provider refused: the driver records the failure and feeds the observation
    w.commit(RequestFailed("p", EPOCH, request.op_id, "capacity_unavailable"))
    w.state = observe(w.state, CapacityUnavailable("p", "cheap", w.now), w.policy).state
    second = w.plan(snap)
    assert [(a.provider, a.template_id, a.count) for a in second.actions] == [("q", "dear", 2)]
    assert second.decisions[0].blocked[0].reasons == (f"capacity_unavailable until {NOW + 180:.1f}",)
    w.commit_actions(second.actions)
    w.now += 180
    third = w.plan(snapshot(2, item("d", 3)))
    assert [(a.provider, a.template_id, a.count) for a in third.actions] == [("p", "cheap", 1)]


def test_quota_pauses_requests_but_not_returns():
    w = world(offer("p", "cheap", price=0.1), offer("q", "dear", price=0.2))
    made = running(w, snapshot(1, item("d", 1)))
    w.state = observe(w.state, ProviderUnhealthy("p", "quota_exceeded", w.now, "limit"), w.policy).state
    w.host(made[0], HostStatus.IDLE)
    w.now += w.policy.idle_time
    result = w.plan(snapshot(2, item("other", 2)))  # one idle machine is reused, one more is bought at q
    assert [(a.provider, a.template_id, a.count) for a in result.actions] == [("q", "dear", 1)]
    assert "unhealthy (quota_exceeded: limit)" in result.decisions[0].blocked[0].reasons[0]
    w.commit_actions(result.actions)
    assert [(type(a).__name__, a.provider) for a in w.plan(snapshot(3)).actions] == [("ReturnMachines", "p")]


def test_max_number_spills_to_the_next_offer_and_provider_cap_binds():
    w = world(
        offer("p", "small", max_number=2, price=0.1),
        offer("p", "big", price=0.3),
        offer("q", "x", price=0.5),
        provider_caps={"p": 4},
    )
    result = w.plan(snapshot(1, item("d", 7)))
    assert [(a.provider, a.template_id, a.count) for a in result.actions] == [
        ("p", "small", 2),
        ("p", "big", 2),
        ("q", "x", 3),
    ]
    w.commit_actions(result.actions)
    again = w.plan(snapshot(2, item("d", 8)))
    assert [(a.provider, a.template_id, a.count) for a in again.actions] == [("q", "x", 1)]
    reasons = {r.template_id: r.reasons for r in again.decisions[0].rejected}
    assert reasons == {
        "small": ("template at maxNumber 2 (2 live or requested)",),
        "big": ("max_machines 4/4 (provider cap reached)",),
    }


def test_step_limit_is_a_sliding_window():
    w = world(step_limit=3, step_interval=60.0)
    first = w.plan(snapshot(1, item("d", 10)))
    assert [a.count for a in first.actions] == [3]
    assert [n.kind for n in first.notes] == ["unmet_demand"] and first.decisions[0].unmet == 7
    w.commit_actions(first.actions)
    w.now += 59.9
    assert w.plan(snapshot(1, item("d", 10))).actions == ()
    w.now += 0.1
    assert [a.count for a in w.plan(snapshot(1, item("d", 10))).actions] == [3]


def test_a_machine_that_never_joins_is_returned_at_the_deadline_and_replaced():
    w = world()
    snap = snapshot(1, item("d", 1))
    first = w.plan(snap)
    w.commit_actions(first.actions)
    (machine_id,) = w.fulfil(first.actions[0].op_id)
    w.now += 899
    assert w.plan(snap).actions == ()
    w.now += 1
    result = w.plan(snap)
    assert result.actions == (
        ReturnMachines("c1:p:i0:1", "p", (machine_id,), "never_joined"),
        RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),
    )
    # a machine with an unknown launch time counts from when the planner first saw it
    w.commit_actions(result.actions)
    (late,) = w.fulfil("c1:p:i0:2", launch=0.0)
    w.now += 10
    w.plan(snap)
    assert w.state.machine_seen == {late: w.now}
    w.now += 899
    assert w.plan(snap).actions == ()
    w.now += 1
    assert [a.reason for a in w.plan(snap).actions if isinstance(a, ReturnMachines)] == ["never_joined"]


def test_idle_machines_go_back_only_when_not_needed_and_never_busy():
    w = world(idle_time=300.0)
    a, b, c = running(w, snapshot(1, item("d", 3)))
    w.host(a, HostStatus.IDLE, since=w.now - 500)
    w.host(b, HostStatus.IDLE, since=w.now - 400)
    w.host(c, HostStatus.BUSY)
    assert w.plan(snapshot(1, item("d", 3))).actions == ()  # needed
    result = w.plan(snapshot(2, item("d", 2)))
    assert result.actions == (ReturnMachines("c1:p:i0:1", "p", (a,), "idle"),)  # longest idle first
    w.commit_actions(result.actions)
    assert w.plan(snapshot(3, item("d", 0))).actions == (ReturnMachines("c1:p:i0:2", "p", (b,), "idle"),)
    w.host(b, HostStatus.IDLE, since=w.now - 10)
    assert w.plan(snapshot(3, item("d", 0))).actions == ()  # in flight already


def test_idle_too_briefly_is_kept():
    w = world(idle_time=300.0)
    (a,) = running(w, snapshot(1, item("d", 1)))
    w.host(a, HostStatus.JOINED, since=w.now - 299)
    assert w.plan(snapshot(2)).actions == ()
    w.now += 1
    assert kinds(w.plan(snapshot(2)).actions) == ["ReturnMachines"]


def test_max_ttl_retires_once_idle_and_a_replacement_is_requested():
    w = world(max_ttl=3600.0)
    (a,) = running(w, snapshot(1, item("d", 1)))
    w.now += 4000
    w.host(a, HostStatus.IDLE)
    result = w.plan(snapshot(1, item("d", 1)))
    assert result.actions == (
        ReturnMachines("c1:p:i0:1", "p", (a,), "max_ttl"),
        RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),
    )


def test_reclaimed_machine_is_marked_lost_and_replaced():
    w = world()
    (a, b) = running(w, snapshot(1, item("d", 2)))
    w.state = observe(w.state, Reclaimed("p", (a, "unknown"), w.now), w.policy).state
    result = w.plan(snapshot(1, item("d", 2)))
    assert result.actions == (
        MarkLost("c1:p:i0:1", "p", a, "reclaimed"),
        RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),
    )
    w.commit_actions(result.actions)
    assert w.plan(snapshot(1, item("d", 2))).actions == ()
    assert set(w.state.reclaimed) == {"unknown"}
    w.now += w.policy.reclaim_memory
    last = w.plan(snapshot(1, item("d", 2)))
    assert w.state.reclaimed == {} and [n.kind for n in last.notes] == ["unknown_reclaim"]


def test_provisioning_timeout_fails_the_intent_and_returns_its_unjoined_machines():
    w = world(provisioning_timeout=600.0)
    snap = snapshot(1, item("d", 3))
    first = w.plan(snap)
    w.commit_actions(first.actions)
    op_id = first.actions[0].op_id
    joined, waiting = w.fulfil(op_id, 2)
    w.host(joined, HostStatus.BUSY)
    w.now += 599
    assert w.plan(snap).actions == ()
    w.now += 1
    result = w.plan(snap)
    # the returned machine is replaced at once; the failing intent's missing machine once the failure is committed
    assert result.actions == (
        FailRequest(op_id, "p", "provisioning_timeout"),
        ReturnMachines("c1:p:i0:1", "p", (waiting,), "provisioning_timeout"),
        RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),
    )
    assert w.plan(snap).actions == ()  # all in flight
    w.commit_actions(result.actions)
    replaced = w.plan(snap)
    assert replaced.actions == (RequestMachines("c1:p:i0:3", "p", "t", 1, "d", price=QUOTE),)


def test_throttle_defers_returns_and_blocks_requests():
    w = world(offer("p", "t"), offer("p", "arm", arch="ARM64"))
    (a,) = running(w, snapshot(1, item("d", 1, arch="x86_64")))
    w.host(a, HostStatus.IDLE, since=w.now - 1000)
    w.state = observe(w.state, Throttled("p", w.now, jitter=1.0), w.policy).state
    snap = snapshot(2, item("e", 1, arch="arm64"))
    result = w.plan(snap)
    assert result.actions == ()
    assert sorted(n.kind for n in result.notes) == ["deferred", "unmet_demand"]
    w.now += 2
    assert kinds(w.plan(snap).actions) == ["ReturnMachines", "RequestMachines"]


def test_dropped_action_is_planned_again_with_a_new_op_id():
    w = world()
    first = w.plan(snapshot(1, item("d", 2)))
    w.drop(first.actions[0].op_id)
    assert w.plan(snapshot(1, item("d", 2))).actions == (RequestMachines("c1:p:i0:1", "p", "t", 2, "d", price=QUOTE),)


def test_without_a_snapshot_only_deadlines_and_reclaims_act():
    w = world()
    (a, b) = running(w, snapshot(1, item("d", 2)))
    w.host(a, HostStatus.IDLE, since=w.now - 10_000)
    w.hosts.pop(w.view.machines[b].instance_ref)
    w.now += 1000
    result = w.plan(None)
    assert result.actions == (ReturnMachines("c1:p:i0:1", "p", (b,), "never_joined"),)
    assert [n.kind for n in result.notes] == ["no_snapshot"]
    assert w.state.applied_seq == 1


def test_idle_machines_of_a_vanished_item_serve_a_compatible_new_one():
    w = world(offer("p", "t", ncpus=4))
    (a, b) = running(w, snapshot(1, item("old", 2)))
    w.host(a, HostStatus.IDLE, since=w.now - 1000)
    w.host(b, HostStatus.IDLE, since=w.now - 1000)
    result = w.plan(snapshot(2, item("new", 1, ncpus=2), item("gpu", 1, gpus=1)))
    # one idle machine is reused for "new", the other goes back; "gpu" fits no offer
    assert kinds(result.actions) == ["ReturnMachines"] and result.actions[0].machine_ids == (a,)
    decisions = {d.demand_id: d for d in result.decisions}
    assert decisions["new"].reused == 1 and decisions["new"].requested == ()
    assert decisions["gpu"].unmet == 1
    assert decisions["gpu"].rejected[0].reasons == ("ngpus 0 < 1 required",)


def test_adopted_machines_serve_no_item_and_go_back_when_idle():
    w = world()
    w.commit(OrphanAdopted("p", EPOCH, "adopt-1", "x1", "ref-x1"))
    w.host("x1", HostStatus.IDLE, since=w.now - 1000)
    assert w.view.machines["x1"].demand_id == ""
    assert w.plan(snapshot(1, item("d", 0))).actions == (ReturnMachines("c1:p:i0:0", "p", ("x1",), "idle"),)


def test_returns_are_batched_and_grouped_per_provider_and_reason():
    w = world(offer("p", "t"), offer("q", "t", price=0.2), return_batch=2)
    made = running(w, snapshot(1, item("d", 3, providers=["p"]), item("e", 2, providers=["q"])))
    for machine_id in made:
        w.host(machine_id, HostStatus.IDLE, since=w.now - 1000)
    result = w.plan(snapshot(2))
    assert [(a.provider, len(a.machine_ids), a.reason) for a in result.actions] == [
        ("p", 2, "idle"),
        ("p", 1, "idle"),
        ("q", 2, "idle"),
    ]
    assert len({a.op_id for a in result.actions}) == 3


def test_duplicate_and_empty_demand_ids_are_ignored_with_a_note():
    w = world()
    result = w.plan(snapshot(1, item("d", 1), item("d", 5), item("", 2)))
    assert [a.count for a in result.actions] == [1]
    assert [n.kind for n in result.notes] == ["invalid_demand", "invalid_demand"]


def test_now_must_be_finite():
    import pytest

    w = world()
    w.now = float("nan")
    with pytest.raises(ValueError, match="finite"):
        w.plan(snapshot(1, item("d", 1)))


SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
from reconcile_world import World, item, offer, snapshot
from provisionerd.domain.model import HostStatus
from provisionerd.planner.state import Reclaimed, observe
w = World([offer("p", "a", price=0.1, max_number=3), offer("q", "b", price=0.1), offer("q", "c", price=None)])
first = w.plan(snapshot(1, item("x", 4), item("y", 2, ncpus=2), item("z", 1)))
w.commit_actions(first.actions)
made = [m for a in first.actions for m in w.fulfil(a.op_id)]
for i, m in enumerate(made):
    w.host(m, [HostStatus.IDLE, HostStatus.BUSY][i % 2], since=w.now - 1000)
w.hosts.pop(w.view.machines[made[0]].instance_ref)
w.state = observe(w.state, Reclaimed("p", tuple(made[1:3]), w.now), w.policy).state
w.now += 1000
second = w.plan(snapshot(2, item("y", 1), item("w", 2)))
print(repr((first.actions, second.actions, second.state, second.decisions)))
print("trio" in sys.modules)
"""


@pytest.mark.process
def test_plans_do_not_depend_on_hash_seeds_and_the_core_never_imports_trio(tmp_path):
    import pathlib
    import sys

    from rigs import procs

    here = str(pathlib.Path(__file__).parent)
    outputs = []
    for seed in ("1", "2"):
        done = procs.run([sys.executable, "-c", SCRIPT, here], env={"PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0].splitlines()[-1] == "False"
    assert "ReturnMachines" in outputs[0] and "MarkLost" in outputs[0]
