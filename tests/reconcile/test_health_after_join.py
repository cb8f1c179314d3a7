"""Health after join (issue 35 item 2, ``planner.health``): a machine whose re-probe falls short of its template
after it joined (``HostState.probed_at``: the agent re-runs its probes and the controller relays the report) is no
longer supply. Idle, it is returned at once as ``unhealthy_after_join``; busy, it is drained out of placement
(never budgeted) and replaced in the same plan, then returned once idle or at ``drain_timeout``. Its offer is not
made suspect (the machine degraded), and it counts against ``max_unhealthy``."""

from __future__ import annotations

from reconcile_world import CLUSTER, World, offer, snapshot
from test_health import BAD, GOOD, gpu_item, requests, returns

from provisionerd.domain.actions import DrainMachines
from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner.policy import Policy, ProviderPolicy


def world(**own) -> World:
    policy = Policy(cluster=CLUSTER, providers={"p": ProviderPolicy(**own)})
    return World([offer(template="gpu", gpus=1, price=0.1)], policy=policy)


def report(w: World, machine_id: str, capabilities: dict[str, str], status: HostStatus, probed: bool) -> None:
    machine = w.view.machines[machine_id]
    w.hosts[machine.instance_ref] = HostState(
        machine.instance_ref,
        "p",
        machine_id,
        status,
        w.now,
        capabilities=capabilities,
        probed_at=w.now if probed else 0.0,
    )


def serving(w: World, count: int, status: HostStatus) -> list[str]:
    """``count`` machines made, joined with a report that passes, and in ``status``."""
    first = w.plan(snapshot(1, gpu_item(count)))
    w.commit_actions(first.actions)
    made = [m for a in requests(first) for m in w.fulfil(a.op_id)]
    for machine_id in made:
        report(w, machine_id, GOOD, status, probed=False)
    w.now += 1
    assert w.plan(snapshot(1, gpu_item(count))).actions == ()  # supply: nothing to do
    return made


def drains(result) -> list[DrainMachines]:
    return [a for a in result.actions if isinstance(a, DrainMachines)]


def test_an_idle_machine_whose_re_probe_fails_is_returned_and_replaced_from_the_same_offer() -> None:
    w = world()
    (machine_id,) = serving(w, 1, HostStatus.IDLE)
    report(w, machine_id, BAD, HostStatus.IDLE, probed=True)
    w.now += 1
    result = w.plan(snapshot(1, gpu_item()))
    (back,) = returns(result)
    assert back.machine_ids == (machine_id,) and back.reason == "unhealthy_after_join: ngpus 0 < 1 required"
    (replacement,) = requests(result)
    assert replacement.template_id == "gpu"  # not suspect: the machine degraded, not the kind of machine
    assert "unhealthy_after_join" in {n.kind for n in result.notes}
    assert [e[2] for e in result.state.unhealthy] == [machine_id]  # a finding for max_unhealthy


def test_a_busy_machine_is_drained_and_replaced_then_returned_once_idle() -> None:
    w = world(disruption_budget=0)  # the drain is not a choice of ours: no budget holds it
    (machine_id,) = serving(w, 1, HostStatus.BUSY)
    report(w, machine_id, BAD, HostStatus.BUSY, probed=True)
    w.now += 1
    first = w.plan(snapshot(1, gpu_item()))
    (drain,) = drains(first)
    assert drain.machine_ids == (machine_id,) and drain.reason == "unhealthy_after_join"
    assert sum(a.count for a in requests(first)) == 1 and returns(first) == []  # replaced first, busy: kept
    w.commit_actions(first.actions)
    w.now += 5
    assert w.plan(snapshot(1, gpu_item())).actions == ()  # draining: asked once, the replacement is under way
    report(w, machine_id, BAD, HostStatus.IDLE, probed=True)  # its job ended
    w.now += 1
    (back,) = returns(w.plan(snapshot(1, gpu_item())))
    assert back.machine_ids == (machine_id,) and back.reason.startswith("unhealthy_after_join: ")


def test_a_busy_machine_that_never_goes_idle_is_returned_at_drain_timeout() -> None:
    w = world(drain_timeout=600.0)
    (machine_id,) = serving(w, 1, HostStatus.BUSY)
    report(w, machine_id, BAD, HostStatus.BUSY, probed=True)
    w.now += 1
    first = w.plan(snapshot(1, gpu_item()))
    w.commit_actions(first.actions)
    assert first.wake_at is not None and first.wake_at <= w.now + 600.0
    w.now += 599
    assert returns(w.plan(snapshot(1, gpu_item()))) == []
    w.now += 1
    (back,) = returns(w.plan(snapshot(1, gpu_item())))
    assert back.reason == "unhealthy_after_join: ngpus 0 < 1 required"


def test_a_bad_image_cannot_churn_the_fleet_past_max_unhealthy() -> None:
    """Two machines degrade after joining, max_unhealthy 1: both go, the provider is protected, no replacement."""
    w = world(max_unhealthy=1, max_unhealthy_window=600.0)
    made = serving(w, 2, HostStatus.IDLE)
    for machine_id in made:
        report(w, machine_id, BAD, HostStatus.IDLE, probed=True)
    w.now += 1
    result = w.plan(snapshot(1, gpu_item(2)))
    assert sorted(m for r in returns(result) for m in r.machine_ids) == sorted(made)
    assert requests(result) == []
    assert "provider_protected" in {n.kind for n in result.notes}


def test_a_re_probe_that_passes_changes_nothing() -> None:
    w = world()
    made = serving(w, 2, HostStatus.BUSY)
    for machine_id in made:
        report(w, machine_id, GOOD, HostStatus.BUSY, probed=True)
    w.now += 1
    assert w.plan(snapshot(1, gpu_item(2))).actions == ()
