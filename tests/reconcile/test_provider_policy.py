"""Per-provider policy (each provider's deadlines, caps, step limit and back-offs reach its own machines only) and the
unhealthy state (``auth_failed``, ``invalid_request``, ``quota_exceeded``) in the pure planner.

The two-provider world is the issue's: ``spot`` (join deadline 120 s, max_ttl 3600 s) and ``onprem`` (join deadline
1800 s, no max_ttl). Merged into one policy, as before, both got join deadline 1800 and max_ttl 3600.
"""

import pytest
from reconcile_world import CLUSTER, World, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import HostStatus
from provisionerd.planner.capacity import (
    CallSucceeded,
    CapacityUnavailable,
    ProbeStarted,
    ProbeSucceeded,
    ProviderResumed,
    ProviderUnhealthy,
)
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import PlannerState, observe

SPOT = ProviderPolicy(join_deadline=120.0, max_ttl=3600.0, idle_time=60.0, capacity_backoff=30.0)
ONPREM = ProviderPolicy(join_deadline=1800.0, max_ttl=None, idle_time=600.0, capacity_backoff=600.0)
POLICY = Policy(cluster=CLUSTER, providers={"spot": SPOT, "onprem": ONPREM})


def two_providers(**policy) -> World:
    offers = [offer("spot", "s", price=0.1), offer("onprem", "o", price=None)]
    return World(offers, policy=Policy(cluster=CLUSTER, **{"providers": {"spot": SPOT, "onprem": ONPREM}, **policy}))


def started(w: World) -> dict[str, list[str]]:
    """One machine at each provider (demand items pinned to each), committed and launched now; not joined."""
    result = w.plan(snapshot(1, item("a", 1, providers=["spot"]), item("b", 1, providers=["onprem"])))
    w.commit_actions(result.actions)
    return {a.provider: w.fulfil(a.op_id) for a in result.actions if isinstance(a, RequestMachines)}


def returns(actions) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(a.provider, a.reason, a.machine_ids) for a in actions if isinstance(a, ReturnMachines)]


def test_the_join_deadline_is_each_providers_own():
    w = two_providers()
    made = started(w)
    snap = snapshot(1, item("a", 1, providers=["spot"]), item("b", 1, providers=["onprem"]))
    w.now += 119.0
    assert returns(w.plan(snap).actions) == []
    w.now += 1.0  # 120 s: spot's machine is late, onprem's is not (it has 1800 s)
    result = w.plan(snap)
    assert returns(result.actions) == [("spot", "never_joined", tuple(made["spot"]))]
    w.commit_actions(result.actions)
    w.now += 1800.0 - 120.0 - 1.0
    assert returns(w.plan(snap).actions) == []
    w.now += 1.0
    assert returns(w.plan(snap).actions) == [("onprem", "never_joined", tuple(made["onprem"]))]


def test_max_ttl_retires_only_the_machines_of_the_provider_that_has_one():
    w = two_providers()
    made = started(w)
    snap = snapshot(1, item("a", 1, providers=["spot"]), item("b", 1, providers=["onprem"]))
    for machines in made.values():
        w.host(machines[0], HostStatus.IDLE)
    w.now += 3600.0
    result = w.plan(snap)
    assert returns(result.actions) == [("spot", "max_ttl", tuple(made["spot"]))]
    w.commit_actions(result.actions)
    w.now += 100_000.0  # onprem's machine, idle and needed, is never retired for its age
    assert not [r for r in returns(w.plan(snap).actions) if r[0] == "onprem"]


def test_idle_time_is_each_providers_own():
    w = two_providers()
    made = started(w)
    for machines in made.values():
        w.host(machines[0], HostStatus.IDLE)
    w.now += 60.0  # demand gone: spot's idle machine goes after its 60 s, onprem's waits for its 600 s
    assert returns(w.plan(snapshot(2)).actions) == [("spot", "idle", tuple(made["spot"]))]
    w.now += 540.0
    assert returns(w.plan(snapshot(3)).actions) == [("onprem", "idle", tuple(made["onprem"]))]


def test_the_provisioning_timeout_is_each_providers_own():
    policy = Policy(
        cluster=CLUSTER,
        providers={
            "spot": ProviderPolicy(provisioning_timeout=60.0),
            "onprem": ProviderPolicy(provisioning_timeout=600.0),
        },
    )
    w = World([offer("spot", "s", price=0.1), offer("onprem", "o", price=None)], policy=policy)
    snap = snapshot(1, item("a", 1, providers=["spot"]), item("b", 1, providers=["onprem"]))
    w.commit_actions(w.plan(snap).actions)
    w.now += 60.0
    assert [(type(a).__name__, a.provider) for a in w.plan(snap).actions] == [("FailRequest", "spot")]


def test_caps_and_step_limits_are_each_providers_own():
    policy = Policy(
        cluster=CLUSTER,
        providers={"spot": ProviderPolicy(step_limit=2), "onprem": ProviderPolicy(max_machines=3)},
    )
    w = World([offer("spot", "s", price=0.1), offer("onprem", "o", price=0.2)], policy=policy)
    result = w.plan(snapshot(1, item("d", 10)))
    asked = [(a.provider, a.count) for a in result.actions if isinstance(a, RequestMachines)]
    assert asked == [("spot", 2), ("onprem", 3)]  # spot's step limit, then onprem's cap
    reasons = {r.provider: r.reasons[0] for r in result.decisions[0].blocked}
    assert reasons == {}  # both were used up to their own limit, neither blocked from the start
    w.commit_actions(result.actions)
    again = w.plan(snapshot(2, item("d", 10)))
    blocked = {r.provider: r.reasons[0] for r in again.decisions[0].blocked}
    assert blocked == {
        "spot": "provider step limit 2 per 60s reached",
        "onprem": "max_machines 3/3 (provider cap reached)",
    }
    w.now += 60.0  # spot's window has passed; onprem stays at its cap
    assert [(a.provider, a.count) for a in w.plan(snapshot(3, item("d", 10))).actions] == [("spot", 2)]


def test_capacity_backoff_is_each_providers_own():
    state = observe(PlannerState(), CapacityUnavailable("spot", "s", 0.0), POLICY).state
    state = observe(state, CapacityUnavailable("onprem", "o", 0.0), POLICY).state
    assert state.capacity.unavailable == {("spot", "s"): 30.0, ("onprem", "o"): 600.0}


def test_a_provider_without_its_own_policy_gets_the_global_knobs():
    policy = Policy(cluster=CLUSTER, join_deadline=77.0, provider_caps={"x": 4}, providers={"spot": SPOT})
    assert policy.of("spot") is SPOT
    assert policy.of("other").join_deadline == 77.0 and policy.of("other").max_machines is None
    assert policy.of("x").max_machines == 4 and policy.min_join_deadline == 77.0
    with pytest.raises(ConfigError) as caught:
        Policy(provider_caps={"spot": 1}, providers={"spot": SPOT})
    assert caught.value.problems == ("provider_caps.spot: set max_machines in providers.spot instead",)
    with pytest.raises(ConfigError):
        ProviderPolicy(join_deadline=0.0, step_limit=0)


# --- unhealthy providers -----------------------------------------------------------------------------------------


def test_auth_failed_blocks_requests_and_returns_until_a_probe_succeeds():
    w = two_providers()
    made = started(w)
    w.host(made["spot"][0], HostStatus.IDLE)
    observed = observe(w.state, ProviderUnhealthy("spot", "auth_failed", w.now, "bad key"), w.policy)
    assert [n.kind for n in observed.notes] == ["provider_unhealthy"]
    w.state = observed.state
    w.now += 100.0
    # Demand moved to onprem: spot's idle machine would go back (idle 100 s > 60 s), but the return waits.
    result = w.plan(snapshot(2, item("c", 2, providers=["onprem"])))
    assert [(a.provider, type(a).__name__) for a in result.actions] == [("onprem", "RequestMachines")]
    assert [n.detail for n in result.notes if n.kind == "deferred"] == [
        f"1 idle return(s) wait: provider 'spot' unhealthy (auth_failed: bad key): next probe at {w.now - 70:.1f}"
    ]
    w.commit_actions(result.actions)
    # e wants 2 at spot: the idle machine is reused (no call), the second is not requested.
    snap = snapshot(3, item("c", 2, providers=["onprem"]), item("e", 2, providers=["spot"]))
    result = w.plan(snap)
    assert result.actions == ()
    (decision,) = result.decisions
    assert decision.reused == 1 and decision.unmet == 1
    assert "unhealthy (auth_failed: bad key)" in decision.blocked[0].reasons[0]
    w.state = observe(w.state, ProbeSucceeded("spot", w.now), w.policy).state
    assert [(a.provider, a.count) for a in w.plan(snap).actions] == [("spot", 1)]


def test_quota_exceeded_blocks_requests_but_not_returns():
    state = observe(PlannerState(), ProviderUnhealthy("spot", "quota_exceeded", 0.0), POLICY).state
    assert state.capacity.refuses("spot") and not state.capacity.refuses("spot", returning=True)
    assert state.capacity.unhealthy["spot"].until == SPOT.quota_pause


def test_the_probe_steps_double_and_a_good_probe_keeps_the_count():
    policy = Policy(cluster=CLUSTER, providers={"p": ProviderPolicy(unhealthy_base=30.0, unhealthy_max=200.0)})
    state = observe(PlannerState(), ProviderUnhealthy("p", "auth_failed", 0.0), policy).state
    dues = [state.capacity.unhealthy["p"].until]
    for _ in range(4):  # each probe fails: the next one is due twice as late, capped
        now = dues[-1]
        assert state.capacity.probe_due("p", now) and not state.capacity.probe_due("p", now - 0.1)
        state = observe(state, ProbeStarted("p", now), policy).state
        failed = observe(state, ProviderUnhealthy("p", "auth_failed", now + 1.0), policy)
        assert failed.notes == () and failed.state == state  # the probe's failure is the step it began
        dues.append(state.capacity.unhealthy["p"].until)
    assert [round(b - a, 3) for a, b in zip(dues, dues[1:], strict=False)] == [60.0, 120.0, 200.0, 200.0]
    assert observe(state, ProbeStarted("p", dues[-1] - 1.0), policy).state == state  # not due: nothing changes
    healthy = observe(state, ProbeSucceeded("p", dues[-1]), policy)
    assert [n.kind for n in healthy.notes] == ["provider_healthy"] and not healthy.state.capacity.unhealthy
    # The request after the good probe fails again: the count goes on (a probe cannot prove a request valid) ...
    again = observe(healthy.state, ProviderUnhealthy("p", "invalid_request", 2000.0), policy).state
    assert again.capacity.unhealthy["p"].until == 2200.0
    # ... and a request that succeeds starts it over.
    reset = observe(observe(again, ProbeSucceeded("p", 2200.0), policy).state, CallSucceeded("p"), policy).state
    assert reset.capacity.strikes == {}
    fresh = observe(reset, ProviderUnhealthy("p", "auth_failed", 3000.0), policy).state
    assert fresh.capacity.unhealthy["p"].until == 3030.0


def test_a_return_that_succeeds_clears_only_auth_failed():
    quota = observe(PlannerState(), ProviderUnhealthy("p", "quota_exceeded", 0.0), POLICY).state
    assert observe(quota, CallSucceeded("p", "returnMachines"), POLICY).state.capacity.unhealthy
    assert not observe(quota, CallSucceeded("p"), POLICY).state.capacity.unhealthy
    auth = observe(PlannerState(), ProviderUnhealthy("p", "auth_failed", 0.0), POLICY).state
    assert not observe(auth, CallSucceeded("p", "returnMachines"), POLICY).state.capacity.unhealthy
    lifted = observe(auth, ProviderResumed("p"), POLICY)
    assert not lifted.state.capacity.unhealthy and lifted.notes[0].kind == "provider_healthy"


def test_only_configuration_codes_make_a_provider_unhealthy():
    with pytest.raises(ValueError, match="capacity_unavailable"):
        ProviderUnhealthy("p", "capacity_unavailable", 0.0)
