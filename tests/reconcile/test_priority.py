"""Provider priority (issue 35 item 3): a provider's offers are chosen before any of a higher priority number,
which serves only what the first cannot (its cap, a back-off, health, compatibility); price orders offers within one
priority. Of a demand item's surplus idle machines, the highest number goes first, and ``provisionerd machines``
(``planner.outlook``) shows the same ones going."""

from __future__ import annotations

import pytest
from reconcile_world import CLUSTER, EPOCH, NOW, World, item, offer, snapshot
from rigs.daemon import parsed_config

from provisionerd.controller.view import ControllerView
from provisionerd.daemon.builder import policy_from_config
from provisionerd.daemon.machines_admin import MachinesPager
from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import HostStatus, RequestIntent
from provisionerd.planner.capacity import CapacityUnavailable
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import observe

ONPREM, CLOUD = "onprem", "cloud"


def policy(*, cloud_priority: int = 1, onprem_cap: int = 4) -> Policy:
    return Policy(
        cluster=CLUSTER,
        step_limit=100,
        providers={
            ONPREM: ProviderPolicy(priority=0, max_machines=onprem_cap, idle_time=50.0),
            CLOUD: ProviderPolicy(priority=cloud_priority, idle_time=50.0),
        },
    )


def world(p: Policy) -> World:
    # The cloud is cheaper: price alone would send everything there.
    return World([offer(ONPREM, "t", price=1.0), offer(CLOUD, "t", price=0.1)], policy=p)


def requested(result) -> dict[str, int]:
    counts: dict[str, int] = {}
    for action in result.actions:
        if isinstance(action, RequestMachines):
            counts[action.provider] = counts.get(action.provider, 0) + action.count
    return counts


def test_demand_beyond_the_first_priority_cap_and_only_that_goes_to_the_next() -> None:
    w = world(policy())
    assert requested(w.plan(snapshot(1, item("d", 6, ncpus=1)))) == {ONPREM: 4, CLOUD: 2}
    # The same demand with one priority: the cheapest takes it all.
    flat = world(policy(cloud_priority=0))
    assert requested(flat.plan(snapshot(1, item("d", 6, ncpus=1)))) == {CLOUD: 6}


def test_a_backed_off_first_priority_lets_the_next_serve() -> None:
    w = world(policy())
    w.state = observe(w.state, CapacityUnavailable(ONPREM, "t", NOW), w.policy).state
    assert requested(w.plan(snapshot(1, item("d", 3, ncpus=1)))) == {CLOUD: 3}


def machines_of(w: World, provider: str, n: int, idle_since: float) -> list[str]:
    made = []
    for i in range(n):
        op_id = f"{CLUSTER}:{provider}:seed:{i}"
        w.commit(RequestIntent(provider, EPOCH, op_id, "t", 1, (f"{op_id}/0",), ("h" * 64,), "d"))
        (machine_id,) = w.fulfil(op_id, launch=NOW - 1000)
        w.host(machine_id, HostStatus.IDLE, since=idle_since)
        made.append(machine_id)
    return made


def test_the_surplus_of_the_higher_number_goes_first_and_machines_shows_the_same() -> None:
    p = policy()
    w = world(p)
    # On-premises machines have been idle longer: by idle time alone they would go first.
    onprem = machines_of(w, ONPREM, 3, NOW - 500)
    cloud = machines_of(w, CLOUD, 2, NOW - 100)
    demand = snapshot(1, item("d", 3, ncpus=1))
    returned = [m for a in w.plan(demand).actions if isinstance(a, ReturnMachines) for m in a.machine_ids]
    assert sorted(returned) == sorted(cloud)
    view = ControllerView(1, "primary", 1, w.view, w.hosts, demand)
    pager = MachinesPager(lambda: view, lambda: w.state, lambda: p, lambda: NOW)
    lines = {line["machine_id"]: line for line in pager.page({"limit": 10})["machines"]}
    going = {m for m, line in lines.items() if line["next_reason"] == "idle"}
    assert going == set(cloud) and not going & set(onprem)


def test_a_priority_must_be_a_count() -> None:
    with pytest.raises(ConfigError, match="priority"):
        ProviderPolicy(priority=-1)


def test_priority_is_read_from_each_providers_config_and_refused_when_negative(tmp_path) -> None:
    providers = """
    [[providers]]
    name = "onprem"
    transport = "oneshot"
    path = "plugins/onprem"
    [[providers]]
    name = "cloud"
    transport = "oneshot"
    path = "plugins/cloud"
    priority = 1
"""
    p = policy_from_config(parsed_config(tmp_path, providers))
    assert (p.of(ONPREM).priority, p.of(CLOUD).priority) == (0, 1) and p.priorities == {CLOUD: 1}
    with pytest.raises(ConfigError, match="priority"):
        parsed_config(tmp_path, providers.replace("priority = 1", "priority = -1"))


def test_a_templates_own_priority_replaces_its_providers() -> None:
    """Per-template priority (issue 35 item 3): within one provider, "spot" (cheaper) at 2 serves only what
    "ondemand" at 1 cannot; on-premises (provider priority 0) first of all."""
    p = Policy(
        cluster=CLUSTER,
        step_limit=100,
        providers={
            ONPREM: ProviderPolicy(priority=0, max_machines=2, idle_time=50.0),
            CLOUD: ProviderPolicy(priority=1, template_priority={"spot": 2}, idle_time=50.0),
        },
    )
    w = World(
        [
            offer(ONPREM, "t", price=1.0),
            offer(CLOUD, "spot", price=0.05),
            offer(CLOUD, "ondemand", price=0.5, max_number=3),
        ],
        policy=p,
    )
    result = w.plan(snapshot(1, item("d", 7, ncpus=1)))
    asked = {(a.provider, a.template_id): a.count for a in result.actions if isinstance(a, RequestMachines)}
    assert asked == {(ONPREM, "t"): 2, (CLOUD, "ondemand"): 3, (CLOUD, "spot"): 2}
    assert p.template_priorities == {(CLOUD, "spot"): 2}
    # Surplus: the spot machines (priority 2) go before the on-demand ones (1), however long idle.
    assert p.surplus_key(CLOUD, 0.0, "m1", "spot") < p.surplus_key(CLOUD, -100.0, "m2", "ondemand")


def test_template_priority_is_read_from_the_config(tmp_path) -> None:
    providers = """
    [[providers]]
    name = "cloud"
    transport = "oneshot"
    path = "plugins/cloud"
    priority = 1
    template_priority = { spot = 2 }
"""
    p = policy_from_config(parsed_config(tmp_path, providers))
    assert p.template_priorities == {(CLOUD, "spot"): 2}
    with pytest.raises(ConfigError):
        parsed_config(tmp_path, providers.replace("spot = 2", "spot = -2"))


def test_unverified_templates_are_read_from_the_config(tmp_path) -> None:
    providers = """
    [[providers]]
    name = "cloud"
    transport = "oneshot"
    path = "plugins/cloud"
    unverified_templates = ["nominal", "other"]
"""
    p = policy_from_config(parsed_config(tmp_path, providers))
    assert p.unverified == {(CLOUD, "nominal"), (CLOUD, "other")}
    with pytest.raises(ConfigError):
        parsed_config(tmp_path, providers.replace('"other"', '""'))
    with pytest.raises(ConfigError):
        parsed_config(tmp_path, providers.replace('["nominal", "other"]', '"nominal"'))
