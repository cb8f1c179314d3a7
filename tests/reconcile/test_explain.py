"""``planner.explain``: the reasons the plan itself gives, per demand item, with their figures."""

from reconcile_world import CLUSTER, World, item, offer, snapshot

from provisionerd.domain.model import HostStatus
from provisionerd.planner.capacity import CapacityUnavailable
from provisionerd.planner.explain import BLOCKED, INCOMPATIBLE, LIMITED, NOT_LEASED, UNTRIED, explain
from provisionerd.planner.headroom import Headroom
from provisionerd.planner.offers import Catalog
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import observe


def world(*offers, **policy):
    return World(list(offers), policy=Policy(cluster=CLUSTER, **policy))


def explained(w, snap, **kwargs):
    before = w.state
    result = w.plan(snap)
    catalog = Catalog(w.offers, w.policy.priorities, w.policy.template_priorities)  # as the daemon builds it
    return result, explain(result, snap, w.view, w.hosts, catalog, before, w.policy, w.now, **kwargs)


def by_id(explanation):
    return {line.demand_id: line for line in explanation.items}


def test_the_cap_and_a_missing_gpu_are_two_different_reasons_for_two_items():
    w = world(offer("p", "cpu", gpus=0), provider_caps={"p": 10})
    snap = snapshot(1, item("cpu", 15), item("gpu", 1, gpus=1))
    first, told = explained(w, snap)
    cpu, gpu = by_id(told)["cpu"], by_id(told)["gpu"]
    # The first plan asks for 10: the cap holds the request (the offer "filled"), not a rejection.
    assert (cpu.requested, cpu.unmet) == (10, 5)
    assert [(o.verdict, o.count, o.reasons) for o in cpu.offers] == [
        (LIMITED, 10, ("max_machines 10/10 (provider cap reached)",))
    ]
    assert cpu.summary == "max_machines 10/10 (provider cap reached)"
    assert gpu.summary == "no template offers gpus >= 1"
    assert [(o.verdict, o.reasons) for o in gpu.offers] == [(INCOMPATIBLE, ("ngpus 0 < 1 required",))]
    # The events carry the same reasons, never "no eligible offer with room" alone.
    details = {n.demand_id: n.detail for n in first.notes if n.kind == "unmet_demand"}
    assert "max_machines 10/10" in details["cpu"] and "ngpus 0 < 1 required" in details["gpu"]
    w.commit_actions(first.actions)
    _, again = explained(w, snap)
    cpu = by_id(again)["cpu"]
    assert (cpu.outstanding, cpu.requested, cpu.unmet) == (10, 0, 5)
    assert [(o.verdict, o.reasons) for o in cpu.offers] == [(BLOCKED, ("max_machines 10/10 (provider cap reached)",))]


def test_a_back_off_names_its_end_and_the_step_window_names_the_offers_not_tried():
    w = world(offer("p", "a", price=0.1), offer("q", "b", price=0.2), step_limit=2, step_interval=60.0)
    w.state = observe(w.state, CapacityUnavailable("p", "a", w.now), w.policy).state
    _, told = explained(w, snapshot(1, item("d", 5)))
    line = by_id(told)["d"]
    assert [(o.provider, o.verdict, o.reasons) for o in line.offers] == [
        ("q", LIMITED, ("step limit 2 per 60s reached (global)",)),
        ("p", BLOCKED, (f"capacity_unavailable until {w.now + 180:.1f}",)),
    ]
    assert line.unmet == 3
    # p/a is blocked only while tried: with the step full, the next plan tries nothing and says until when
    _, later = explained(w, snapshot(1, item("d", 5)))
    line = by_id(later)["d"]
    assert {o.verdict for o in line.offers} == {UNTRIED}
    assert f"global step window full until {w.now + 60:.1f}" in line.summary
    held = {o.provider: o.reasons[1:] for o in line.offers}
    assert held == {"p": (f"then capacity_unavailable until {w.now + 180:.1f}",), "q": ()}


def test_a_full_step_window_does_not_hide_the_cap_behind_it():
    w = world(offer("p", "cpu"), provider_caps={"p": 10}, step_limit=10, step_interval=60.0)
    snap = snapshot(1, item("cpu", 15))
    first, _ = explained(w, snap)
    w.commit_actions(first.actions)
    result, told = explained(w, snap)
    line = by_id(told)["cpu"]
    assert [(o.verdict, o.reasons) for o in line.offers] == [
        (
            UNTRIED,
            (
                f"not tried: global step window full until {w.now + 60:.1f}",
                "then max_machines 10/10 (provider cap reached)",
            ),
        )
    ]
    assert line.summary == (
        f"global step window full until {w.now + 60:.1f}: 1 compatible offer(s) not tried; "
        "then max_machines 10/10 (provider cap reached)"
    )
    (note,) = [n for n in result.notes if n.kind == "unmet_demand"]
    assert note.detail == (
        "5 machine(s) not requested: step limit reached; p/cpu: then max_machines 10/10 (provider cap reached)"
    )


def test_offers_of_a_provider_without_the_lease_are_named():
    w = world()
    snap = snapshot(1, item("d", 1))
    _, told = explained(w, snap, unleased={("s", "t"): "provider 's': lease not held here (standby)"})
    line = by_id(told)["d"]
    assert [(o.provider, o.verdict) for o in line.offers] == [("s", NOT_LEASED)]
    assert line.summary.startswith("no offers: the lease")


def test_surplus_names_the_idle_machines_that_go_and_when():
    w = world(offer("p", "t"), idle_time=600.0)
    result = w.plan(snapshot(1, item("d", 3)))
    w.commit_actions(result.actions)
    made = w.fulfil(result.actions[0].op_id)
    for i, machine_id in enumerate(made):
        w.host(machine_id, HostStatus.IDLE, since=w.now - 100 * i)
    _, told = explained(w, snapshot(2, item("d", 1)))
    line = by_id(told)["d"]
    assert (line.wanted, line.supplied) == (1, 3)
    assert [(s.when, s.at) for s in line.surplus] == [("at", w.now - 200 + 600), ("at", w.now - 100 + 600)]
    assert line.surplus[0].reason == "idle, idle_time 600 s"
    w.now += 600
    _, told = explained(w, snapshot(2, item("d", 1)))
    assert [s.when for s in by_id(told)["d"].surplus] == ["now", "now"]


def test_surplus_held_by_the_disruption_budget_says_so_with_its_figures():
    w = world(offer("p", "t"), providers={"p": ProviderPolicy(disruption_budget=1, disruption_interval=600.0)})
    result = w.plan(snapshot(1, item("d", 3)))
    w.commit_actions(result.actions)
    for machine_id in w.fulfil(result.actions[0].op_id):
        w.host(machine_id, HostStatus.IDLE, since=w.now - 1000)
    _, told = explained(w, snapshot(2, item("d", 1)))
    line = by_id(told)["d"]
    assert sorted(s.when for s in line.surplus) == ["now", "waits"]
    (waiting,) = [s for s in line.surplus if s.when == "waits"]
    assert (
        waiting.reason
        == f"1 idle return(s) wait for the disruption budget (1 per 600s, all used) until {w.now + 600:.1f}"
    )


def test_each_offer_names_its_priority_and_a_cap_sends_the_rest_to_the_next_priority():
    """Issue 35 item 3: on-premises at priority 0 (capped at 4), the cheaper cloud at priority 1 gets only what the
    cap leaves, and explain says which priority each offer had and which limit held the first."""
    w = world(
        offer("onprem", "rack", price=0.9),
        offer("cloud", "vm", price=0.1),
        providers={"onprem": ProviderPolicy(priority=0, max_machines=4), "cloud": ProviderPolicy(priority=1)},
    )
    _, told = explained(w, snapshot(1, item("jobs", 6)))
    jobs = by_id(told)["jobs"]
    assert [(o.provider, o.verdict, o.count, o.priority) for o in jobs.offers] == [
        ("onprem", LIMITED, 4, 0),
        ("cloud", "requested", 2, 1),
    ]
    assert jobs.offers[0].reasons == ("max_machines 4/4 (provider cap reached)",)


def test_warm_headroom_is_named_as_an_item_of_its_own():
    """Issue 35 item 4 (and a review leftover): the headroom rule's item, with or without a deficit."""
    w = world(offer("p", "warm"), headroom=(Headroom("p", "warm", 2),))
    first, told = explained(w, snapshot(1))
    warm = by_id(told)["headroom:p/warm"]
    assert (warm.wanted, warm.requested) == (2, 2)
    assert warm.summary.startswith("warm headroom (providers.headroom): ")
    w.commit_actions(first.actions)
    for action in first.actions:
        for machine_id in w.fulfil(action.op_id):
            w.host(machine_id, HostStatus.IDLE)
    _, again = explained(w, snapshot(2))
    warm = by_id(again)["headroom:p/warm"]
    assert warm.summary == "warm headroom of p/warm: keeps 2 idle machine(s) joined, has 2"
