"""The settle window after a (re)join to a controller, and machines that joined once (issue 31, finding 1).

A controller restart empties its host table until the workers rejoin: read as "never joined", it returned healthy
machines, busy ones included. The worlds below are that restart: machines joined, then every host is gone.
"""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import NOW, World, fuzz_settings, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy
from provisionerd.planner.rejoin import Rejoin

DEADLINE, SETTLE = 20.0, 60.0
POLICY = Policy(cluster="c1", join_deadline=DEADLINE, rejoin_settle=SETTLE)


def joined_fleet(n: int, status: HostStatus = HostStatus.BUSY) -> tuple[World, list[str]]:
    """``n`` machines that joined (and run work), launched 25 s before ``NOW``: older than the join deadline."""
    world = World([offer()], policy=POLICY, now=NOW - 25)
    result = world.plan(snapshot(1, item(count=n, ncpus=4)))
    world.commit_actions(result.actions)
    (request,) = [a for a in result.actions if isinstance(a, RequestMachines)]
    machines = world.fulfil(request.op_id)
    for machine_id in machines:
        world.host(machine_id, status)
    world.now = NOW
    return world, machines


def refs(world: World, machines: list[str]) -> frozenset[str]:
    return frozenset(world.view.machines[m].instance_ref for m in machines)


def controller_restart(world: World) -> None:
    for ref in list(world.hosts):
        del world.hosts[ref]


def returns(world: World, rejoin: Rejoin, wanted: int) -> list[tuple[str, tuple[str, ...]]]:
    result = plan(world.state, snapshot(2, item(count=wanted, ncpus=4)), world.view, world.offers, world.hosts,
                  world.now, world.policy, rejoin)  # fmt: skip
    world.state = result.state
    return [(a.reason, a.machine_ids) for a in result.actions if isinstance(a, ReturnMachines)]


def test_after_a_controller_restart_no_machine_that_joined_is_returned_while_the_window_is_open() -> None:
    world, machines = joined_fleet(5)
    rejoin = Rejoin(NOW, refs(world, machines))
    controller_restart(world)
    assert returns(world, rejoin, 5) == []
    # Two rejoin; the window stays open for the other three (they joined before, so they are expected).
    for machine_id in machines[:2]:
        world.host(machine_id, HostStatus.BUSY)
    world.now = NOW + SETTLE - 1
    assert returns(world, rejoin, 5) == []


def test_the_window_closes_as_soon_as_every_machine_that_joined_before_is_back() -> None:
    world, machines = joined_fleet(3, HostStatus.IDLE)
    rejoin = Rejoin(NOW, refs(world, machines))
    controller_restart(world)
    for machine_id in machines:
        world.host(machine_id, HostStatus.IDLE)
    result = plan(world.state, snapshot(2, item(count=3, ncpus=4)), world.view, world.offers, world.hosts,
                  world.now + 1, world.policy, rejoin)  # fmt: skip
    assert result.actions == () and result.wake_at != NOW + SETTLE


def test_a_machine_that_joined_and_never_came_back_is_returned_as_not_rejoined_never_as_never_joined() -> None:
    world, machines = joined_fleet(2)
    rejoin = Rejoin(NOW, refs(world, machines))
    controller_restart(world)
    world.host(machines[0], HostStatus.BUSY)
    world.now = NOW + SETTLE
    assert returns(world, rejoin, 2) == [("not_rejoined", (machines[1],))]


def test_a_machine_without_a_host_launched_before_the_rejoin_waits_the_whole_window() -> None:
    # It may have joined while this daemon saw nothing, at a controller that has restarted since (seeds 434 and
    # 272546480): every machine that joined before being back proves nothing about it, and after the window it is
    # returned as no_host, never as never_joined (seed 779519691).
    world, machines = joined_fleet(3)
    rejoin = Rejoin(NOW, refs(world, machines[:2]))  # the third never had a host in this process's views
    controller_restart(world)
    for machine_id in machines[:2]:
        world.host(machine_id, HostStatus.BUSY)
    world.now = NOW + SETTLE - 1
    assert returns(world, rejoin, 3) == []
    world.now = NOW + SETTLE
    assert returns(world, rejoin, 3) == [("no_host", (machines[2],))]


def test_a_machine_launched_after_the_rejoin_is_judged_by_its_join_deadline_alone() -> None:
    world, machines = joined_fleet(1, HostStatus.BUSY)
    del world.hosts[world.view.machines[machines[0]].instance_ref]  # it never joined: this generation saw it all
    rejoin = Rejoin(NOW - 30, frozenset())  # the view came up before its launch (NOW - 25)
    assert returns(world, rejoin, 1) == [("never_joined", tuple(machines))]


def test_on_the_daemons_first_view_the_window_is_the_whole_timeout() -> None:
    world, machines = joined_fleet(2)
    controller_restart(world)
    first = Rejoin(NOW, frozenset(), first_view=NOW)
    world.now = NOW + SETTLE - 0.5
    assert returns(world, first, 2) == []
    world.now = NOW + SETTLE
    assert sorted(returns(world, first, 2)) == [("no_host", tuple(sorted(machines)))]


def test_a_window_of_zero_is_the_old_rule() -> None:
    world, machines = joined_fleet(2)
    world.policy = attrs.evolve(POLICY, rejoin_settle=0.0)
    controller_restart(world)
    assert returns(world, Rejoin(NOW, refs(world, machines)), 2) == [("not_rejoined", tuple(sorted(machines)))]


@fuzz_settings(60)
@given(
    n=st.integers(1, 6),
    back=st.sets(st.integers(0, 5)),
    elapsed=st.floats(0, 2 * SETTLE, allow_nan=False),
    status=st.sampled_from([HostStatus.BUSY, HostStatus.IDLE, HostStatus.JOINED]),
)
def test_a_machine_that_joined_once_is_never_returned_as_never_joined(n, back, elapsed, status) -> None:
    world, machines = joined_fleet(n, status)
    rejoin = Rejoin(NOW, refs(world, machines))
    controller_restart(world)
    for i in back:
        if i < n:
            world.host(machines[i], status)
    world.now = NOW + elapsed
    reasons = {reason for reason, _ in returns(world, rejoin, n)}
    assert "never_joined" not in reasons
    if elapsed < SETTLE:
        assert reasons == set()


def test_a_machine_older_than_the_daemons_first_view_and_never_seen_joined_waits_the_whole_window() -> None:
    # Simulation seed 434: the daemon restarted while the controller had lost its host table, so it never saw this
    # machine's host; a later rejoin must not read "every expected machine is back" as "it never joined".
    world, machines = joined_fleet(2)
    controller_restart(world)
    world.host(machines[1], HostStatus.BUSY)
    second = Rejoin(NOW, refs(world, machines[1:]), first_view=NOW - 10)  # both launched at NOW - 25
    assert returns(world, second, 2) == []
    world.now = NOW + SETTLE
    assert returns(world, second, 2) == [("no_host", (machines[0],))]


def test_a_machine_that_joined_under_a_timed_out_intent_is_still_returned_as_not_rejoined() -> None:
    world = World([offer()], policy=POLICY, now=NOW - 2000)
    result = world.plan(snapshot(1, item(count=2, ncpus=4)))
    world.commit_actions(result.actions)
    (request,) = [a for a in result.actions if isinstance(a, RequestMachines)]
    (machine_id,) = world.fulfil(request.op_id, 1)  # the intent stays open: one machine never came
    world.host(machine_id, HostStatus.BUSY)
    rejoin = Rejoin(NOW, refs(world, [machine_id]))
    controller_restart(world)
    world.now = NOW + SETTLE  # past the provisioning timeout (1200 s) and the window
    assert ("not_rejoined", (machine_id,)) in returns(world, rejoin, 2)


def test_an_adopted_machine_without_a_host_is_returned_as_no_host_never_as_never_joined() -> None:
    """Seed 734516497: a machine that had joined the controller's lost incarnation, adopted after the reset (its
    worker's credential unknown to the new store, so it never joins again). Its fact has no launch time, so it
    counted from its adoption, after the view came up, and was returned as ``never_joined``; nothing of its life
    before the adoption was seen."""
    from provisionerd.domain.model import NO_EPOCH, OrphanAdopted

    world = World([offer()], policy=POLICY, now=NOW)
    world.commit(OrphanAdopted("p1", NO_EPOCH, "adopt-1", "m-adopted", "c1/i-old", "h", "10.0.0.9"))
    rejoin = Rejoin(NOW - 100, frozenset())  # the view came up long before the adoption
    assert returns(world, rejoin, 1) == []  # its join deadline counts from when it was first seen
    world.now = NOW + DEADLINE
    assert returns(world, rejoin, 1) == [("no_host", ("m-adopted",))]
