"""Warm headroom (issue 35 item 4, ``planner.headroom``): ``min_idle`` machines of one template kept above the
demand, lent first to demand that arrives and asked for again, never returned for idleness within ``min_idle``,
within the provider's caps, and only in their hours. The planner alone (pure), driven through a changing demand."""

from __future__ import annotations

import pytest
from reconcile_world import CLUSTER, NOW, World, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import HostStatus
from provisionerd.planner.headroom import Headroom, parse_hours
from provisionerd.planner.policy import Policy, ProviderPolicy

WARM = "headroom:p/warm"


def policy(*, min_idle: int = 2, cap: int | None = None, hours: tuple[int, int] | None = None) -> Policy:
    return Policy(
        cluster=CLUSTER,
        step_limit=100,
        providers={"p": ProviderPolicy(idle_time=60.0, max_machines=cap)},
        headroom=(Headroom("p", "warm", min_idle, hours),),
    )


def world(p: Policy) -> World:
    # "cheap" is cheaper and compatible with everything: the headroom must still be "warm" machines.
    return World([offer("p", "warm", ncpus=4, price=1.0), offer("p", "cheap", ncpus=4, price=0.1)], policy=p)


def step(w: World, demand: int, busy: int) -> tuple[dict[str, int], list[ReturnMachines]]:
    """One pass at ``demand``: plan, commit and fulfil what it asks, return what it returns; the new machines join
    idle, and ``busy`` machines run work (the scheduler's choice: the oldest). What was requested, per item."""
    result = w.plan(snapshot(1, item("real", demand, ncpus=1)))
    w.commit_actions(result.actions)
    asked: dict[str, int] = {}
    returns = [a for a in result.actions if isinstance(a, ReturnMachines)]
    for action in result.actions:
        if isinstance(action, RequestMachines):
            asked[action.demand_id] = asked.get(action.demand_id, 0) + action.count
            for machine_id in w.fulfil(action.op_id):
                w.host(machine_id, HostStatus.IDLE, since=w.now)
        w.under_way.pop(action.op_id, None)
    for action in returns:
        w.returned(action)
    for n, machine_id in enumerate(w.active()):
        status = HostStatus.BUSY if n < busy else HostStatus.IDLE
        if w.hosts[w.view.machines[machine_id].instance_ref].status is not status:  # idle since its last change
            w.host(machine_id, status, since=w.now)
    w.now += 5.0
    return asked, returns


def test_no_demand_keeps_min_idle_warm_machines_of_its_template_and_never_returns_them() -> None:
    w = world(policy())
    asked, _ = step(w, 0, 0)
    assert asked == {WARM: 2}
    assert {w.view.machines[m].template_id for m in w.active()} == {"warm"}
    for _ in range(40):  # 200 s, far past idle_time
        asked, returns = step(w, 0, 0)
        assert not asked and not returns
    assert len(w.active()) == 2


def test_arriving_demand_borrows_the_warm_machines_and_they_are_asked_for_again() -> None:
    w = world(policy())
    step(w, 0, 0)
    asked, _ = step(w, 1, 1)  # one job: it takes a warm machine; the headroom asks for one more, "real" for none
    assert asked == {WARM: 1}
    for _ in range(5):
        step(w, 1, 1)
    assert len(w.active()) == 3  # demand 1 + 2 warm


def test_the_fleet_follows_a_changing_demand_plus_min_idle_and_returns_only_above_it() -> None:
    w = world(policy())
    for demand in (0, 3, 3, 1, 5, 5, 0):
        for _ in range(20):  # settle at this demand (100 s: past idle_time)
            step(w, demand, demand)
        live = len(w.active())
        assert live == demand + 2, (demand, live)
        idle = sum(1 for m in w.active() if w.hosts[w.view.machines[m].instance_ref].status is HostStatus.IDLE)
        assert idle == 2


def test_caps_come_first_the_headroom_takes_what_demand_leaves() -> None:
    w = world(policy(cap=3))
    for _ in range(5):
        step(w, 3, 3)
    assert len(w.active()) == 3
    assert not w.active(WARM)


def test_outside_its_hours_the_rule_wants_none_and_its_machines_go_after_idle_time() -> None:
    day_second = int(NOW) % 86_400
    inside = policy(hours=(day_second, (day_second + 100) % 86_400))
    w = world(inside)
    asked, _ = step(w, 0, 0)
    assert asked == {WARM: 2}
    gone = []
    for _ in range(60):  # 300 s: the window closed at 100 s, idle_time is 60 s
        _, returns = step(w, 0, 0)
        gone += [m for r in returns for m in r.machine_ids]
    assert len(gone) == 2 and not w.active()


def test_hours_parse_and_wrap_midnight() -> None:
    assert parse_hours("") is None
    assert parse_hours("08:00-18:00") == (8 * 3600, 18 * 3600)
    night = Headroom("p", "t", 3, parse_hours("22:00-06:00"))
    assert night.wanted_at(23 * 3600) == 3 and night.wanted_at(5 * 3600) == 3 and night.wanted_at(12 * 3600) == 0
    for bad in ("8-18", "08:00-08:00", "25:00-01:00", "08:00"):
        with pytest.raises(ValueError):
            parse_hours(bad)


def test_one_rule_per_template() -> None:
    with pytest.raises(ConfigError, match="one rule per template"):
        Policy(cluster=CLUSTER, headroom=(Headroom("p", "t", 1), Headroom("p", "t", 2)))


def test_the_config_gives_the_rules_and_names_bad_hours(tmp_path) -> None:
    from rigs.daemon import parsed_config

    from provisionerd.daemon.builder import policy_from_config

    providers = """
    [[providers]]
    name = "p"
    transport = "oneshot"
    path = "plugins/p"
    [[providers.headroom]]
    template = "warm"
    min_idle = 2
    hours = "22:00-06:00"
"""
    rules = policy_from_config(parsed_config(tmp_path, providers)).headroom
    assert rules == (Headroom("p", "warm", 2, (22 * 3600, 6 * 3600)),)
    with pytest.raises(ConfigError, match="headroom"):
        policy_from_config(parsed_config(tmp_path, providers.replace("22:00-06:00", "06:00-06:00")))
    with pytest.raises(ConfigError):
        parsed_config(tmp_path, providers.replace("min_idle = 2", "min_idle = -1"))
