"""``provisionerd machines``' next action (``planner.outlook``, read by ``daemon.machines_admin``) agrees with the
planner: the time it shows for a machine's idle return, join deadline, max_ttl or drain timeout is the time the
planner acts on it, within a second, and before that time the planner leaves the machine alone."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import CLUSTER, EPOCH, NOW, World, fuzz_settings, item, offer, snapshot

from provisionerd.controller.view import ControllerView
from provisionerd.daemon.machines_admin import MachinesPager
from provisionerd.domain.actions import DrainMachines, ReturnMachines
from provisionerd.domain.model import DemandSnapshot, HostStatus, RequestIntent
from provisionerd.planner.deadlines import PLAN_SLACK
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.rejoin import SETTLED, Rejoin

POLICY = Policy(
    cluster=CLUSTER,
    providers={
        "a": ProviderPolicy(join_deadline=100.0, idle_time=50.0, max_ttl=900.0, drain_timeout=120.0),
        "b": ProviderPolicy(join_deadline=300.0, idle_time=20.0, priority=1),  # b surplus goes first
    },
)

machines = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.floats(0.0, 1000.0),  # launched this long before NOW
        st.one_of(st.none(), st.floats(0.0, 100.0)),  # not joined, or in its host state since this long before NOW
        st.booleans(),  # busy instead of idle
    ),
    max_size=10,
)


def _world(spec: list[tuple[str, float, float | None, bool]]) -> World:
    world = World([offer("a", "t"), offer("b", "t")], policy=POLICY)
    for n, (provider, age, since, busy) in enumerate(spec):
        op_id = f"{CLUSTER}:{provider}:seed:{n}"
        world.commit(RequestIntent(provider, EPOCH, op_id, "t", 1, (f"{op_id}/0",), ("h" * 64,), "d"))
        (machine_id,) = world.fulfil(op_id, launch=NOW - age)
        if since is not None:
            world.host(machine_id, HostStatus.BUSY if busy else HostStatus.IDLE, since=NOW - since)
    return world


def _lines(world: World, demand: DemandSnapshot, now: float, rejoin: Rejoin = SETTLED) -> dict[str, dict[str, Any]]:
    view = ControllerView(1, "primary", 1, world.view, world.hosts, demand)
    for ref in rejoin.joined_before:
        view.joined.add(ref)
    pager = MachinesPager(lambda: view, lambda: world.state, lambda: POLICY, lambda: now, rejoin=lambda: rejoin)
    found: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        reply = pager.page({"cursor": cursor, "limit": 3})
        found.update((line["machine_id"], line) for line in reply["machines"])
        cursor = reply["cursor"]
        if cursor is None:
            return found


def _acted(result: Any) -> dict[str, tuple[str, str]]:
    """machine_id -> (action, reason) of a plan's returns and drains."""
    acted: dict[str, tuple[str, str]] = {}
    for action in result.actions:
        if isinstance(action, ReturnMachines):
            acted.update((m, ("return", action.reason)) for m in action.machine_ids)
        elif isinstance(action, DrainMachines):
            acted.update((m, ("drain", action.reason)) for m in action.machine_ids)
    return acted


def _settle_now(world: World, demand: DemandSnapshot, rejoin: Rejoin = SETTLED) -> None:
    """Plan at NOW and commit what it decided: what is due now is in flight, the rest waits for its time."""
    result = plan(world.state, demand, world.view, world.offers, world.hosts, NOW, POLICY, rejoin)
    world.state = result.state
    world.commit_actions(result.actions)


@fuzz_settings(300)
@given(machines, st.integers(0, 4), st.one_of(st.none(), st.floats(0.0, 400.0)), st.sets(st.integers(0, 9)))
def test_the_next_time_shown_is_when_the_planner_acts(spec, wanted, rejoined_ago, joined_before):
    """``rejoined_ago``: a (re)join to the controller that long before NOW (its settle window, a's and b's default
    120 s), or none; ``joined_before``: the machines (by position) known to have had a host before it."""
    world = _world(spec)
    refs = frozenset(m.instance_ref for n, m in enumerate(world.view.machines.values()) if n in joined_before)
    rejoin = SETTLED if rejoined_ago is None else Rejoin(NOW - rejoined_ago, refs)
    demand = snapshot(1, item("d", wanted, ncpus=1))
    _settle_now(world, demand, rejoin)
    lines = _lines(world, demand, NOW, rejoin)
    assert set(lines) == {m.machine_id for m in world.view.machines.values() if m.state.live}
    timed = {m: line for m, line in lines.items() if line["next_at"] is not None and line["next_at"] > NOW}
    if not timed:
        # Nothing timed: a plan much later, the inputs unchanged, returns and drains nothing more.
        assert not _acted(
            plan(world.state, demand, world.view, world.offers, world.hosts, NOW + 5000.0, POLICY, rejoin)
        )
        return
    first = min(line["next_at"] for line in timed.values())
    due = {m for m, line in timed.items() if line["next_at"] <= first + PLAN_SLACK}
    if any(timed[m]["next_reason"] != "idle" for m in due):
        # A machine retired for another reason at the same time lowers the item's supply, so an idle machine shown
        # as surplus may be kept after all (the shown idle return holds while the item's supply does: outlook).
        due = {m for m in due if timed[m]["next_reason"] != "idle"}
    before = max(NOW, first - 1.0)
    early = _acted(plan(world.state, demand, world.view, world.offers, world.hosts, before, POLICY, rejoin))
    assert not (set(early) & due), f"acted before the time shown: {early}"
    late = _acted(plan(world.state, demand, world.view, world.offers, world.hosts, first + PLAN_SLACK, POLICY, rejoin))
    for machine_id in due:
        line = timed[machine_id]
        expected = (line["next_action"], line["next_reason"])
        machine = world.view.machines[machine_id]
        ttl = POLICY.of(machine.provider).max_ttl
        if ttl is not None and machine.launch_time + ttl <= first + PLAN_SLACK and line["next_reason"] == "idle":
            expected = ("return", "max_ttl")  # both due within the slack: the plan names the rule it reads first
        assert late.get(machine_id) == expected, (machine_id, line, late)


def test_each_rule_is_named_with_its_time():
    # m1 not joined, launched 10 s ago (b: join_deadline 300 s); m2 idle 5 s on b (idle_time 20 s); m3 busy on a,
    # 800 s old (max_ttl 900 s): drain at 100 s from now; m4 idle on a.
    world = _world(
        [("b", 10.0, None, False), ("b", 500.0, 5.0, False), ("a", 800.0, 1.0, True), ("a", 10.0, 2.0, False)]
    )
    demand = snapshot(1, item("d", 3, ncpus=1))
    _settle_now(world, demand)
    lines = _lines(world, demand, NOW)
    shown = {
        m: (line["next_action"], line["next_at"], line["next_reason"], line["next_rule"]) for m, line in lines.items()
    }
    assert shown["m00001"] == ("return", NOW + 290.0, "never_joined", "join_deadline 300 s")
    assert shown["m00003"] == ("drain", NOW + 100.0, "max_ttl", "max_ttl 900 s")
    # Of the three joined machines one is surplus: the longest idle not busy one, m2 (idle 5 s before m4's 2 s).
    assert shown["m00002"] == ("return", NOW + 15.0, "idle", "idle_time 20 s")
    # m4 is not surplus: no idle return, only a's max_ttl (launched 10 s ago).
    assert shown["m00004"] == ("return", NOW + 890.0, "max_ttl", "max_ttl 900 s")
    assert lines["m00001"]["state"] == "booting" and not lines["m00001"]["joined"]
    assert lines["m00003"]["activity"] == "busy" and lines["m00002"]["activity"] == "idle"
    assert lines["m00002"]["idle_since"] == NOW - 5.0 and lines["m00002"]["age_s"] == 500.0


def test_a_draining_machine_shows_its_drain_timeout_and_goes_then():
    world = _world([("a", 950.0, 1.0, True)])  # busy, past a's max_ttl: drained now
    demand = snapshot(1, item("d", 1, ncpus=1))
    result = world.plan(demand)
    assert _acted(result) == {"m00001": ("drain", "max_ttl")}
    world.commit_actions(result.actions)
    line = _lines(world, demand, NOW + 10.0)["m00001"]
    assert (line["next_action"], line["next_reason"], line["next_rule"]) == (
        "return",
        "drain_timeout",
        "drain_timeout 120 s",
    )
    assert abs(line["next_at"] - (NOW + 120.0)) <= 1.0
    for at, expected in (
        (line["next_at"] - 1.0, {}),
        (line["next_at"] + PLAN_SLACK, {"m00001": ("return", "drain_timeout")}),
    ):
        assert _acted(plan(world.state, demand, world.view, world.offers, world.hosts, at, POLICY)) == expected


def test_in_flight_returns_show_as_returning():
    world = _world([("b", 500.0, 50.0, False)])  # idle past b's idle_time, item wants none
    demand = snapshot(1, item("d", 0, ncpus=1))
    _settle_now(world, demand)
    line = _lines(world, demand, NOW)["m00001"]
    assert (line["state"], line["next_action"], line["next_at"]) == ("returning", "returning", None)


def test_a_machine_past_its_join_deadline_waits_for_the_settle_window_and_shows_its_end():
    # On b (join_deadline 300 s), launched 500 s ago, no host; the controller was rejoined 10 s ago (rejoin_settle
    # 120 s by default): the plan holds it until the window ends, then returns it as no_host (or not_rejoined when
    # it had a host before).
    for joined_before, reason in ((False, "no_host"), (True, "not_rejoined")):
        world = _world([("b", 500.0, None, False)])
        ref = world.view.machines["m00001"].instance_ref
        rejoin = Rejoin(NOW - 10.0, frozenset({ref}) if joined_before else frozenset())
        demand = snapshot(1, item("d", 1, ncpus=1))
        _settle_now(world, demand, rejoin)
        line = _lines(world, demand, NOW, rejoin)["m00001"]
        assert (line["next_action"], line["next_at"], line["next_reason"], line["next_rule"]) == (
            "return",
            NOW + 110.0,
            reason,
            "rejoin_settle 120 s",
        )
        early = plan(world.state, demand, world.view, world.offers, world.hosts, NOW + 109.0, POLICY, rejoin)
        late = plan(
            world.state, demand, world.view, world.offers, world.hosts, NOW + 110.0 + PLAN_SLACK, POLICY, rejoin
        )
        assert _acted(early) == {}
        assert _acted(late) == {"m00001": ("return", reason)}


def test_a_machine_of_an_open_intent_shows_its_provisioning_timeout_when_that_comes_first():
    # An intent of 2 on b (provisioning_timeout 1200 s, join_deadline 300 s) first seen 1100 s ago, one machine made
    # just now and not joined: the intent times out in 100 s, before the machine's join deadline (300 s).
    world = World([offer("a", "t"), offer("b", "t")], policy=POLICY)
    op_id = f"{CLUSTER}:b:seed:0"
    world.commit(RequestIntent("b", EPOCH, op_id, "t", 2, (f"{op_id}/0", f"{op_id}/1"), ("h" * 64,) * 2, "d"))
    world.fulfil(op_id, 1, launch=NOW)
    world.state = attrs.evolve(world.state, intent_seen={op_id: NOW - 1100.0})
    demand = snapshot(1, item("d", 2, ncpus=1))
    line = _lines(world, demand, NOW)["m00001"]
    assert (line["next_action"], line["next_at"], line["next_reason"], line["next_rule"]) == (
        "return",
        NOW + 100.0,
        "provisioning_timeout",
        "provisioning_timeout 1200 s",
    )
    early = plan(world.state, demand, world.view, world.offers, world.hosts, NOW + 99.0, POLICY)
    late = plan(world.state, demand, world.view, world.offers, world.hosts, NOW + 100.0 + PLAN_SLACK, POLICY)
    assert _acted(early) == {}
    assert _acted(late) == {"m00001": ("return", "provisioning_timeout")}
