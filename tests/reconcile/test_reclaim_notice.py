"""Reclaim notices (issue 34, item 4), on the pure planner: a machine whose host carries a spot interruption notice
(``HostState.reclaim_at``) or a rebalance recommendation (``rebalance_at``) is replaced in the same plan, and
returned when it is not busy, or drained and returned at the latest ``RECLAIM_MARGIN`` before the deadline
(``planner.drain.noticed``)."""

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from reconcile_world import item, snapshot
from test_plan import QUOTE, running, world

from provisionerd.domain.actions import DrainMachines, RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus
from provisionerd.planner.drain import RECLAIM_MARGIN
from provisionerd.planner.policy import Policy, ProviderPolicy

DRAIN = 600.0


def noticed_world(status: HostStatus, *, reclaim_in: float = 120.0, rebalance: bool = False):
    """One machine of item d at p, joined with ``status``, then a notice: reclaimed ``reclaim_in`` s from now
    (0: no interruption notice), and with ``rebalance`` a rebalance recommendation now."""
    w = world()
    w.policy = Policy(cluster="c1", providers={"p": ProviderPolicy(drain_timeout=DRAIN)})
    (a,) = running(w, snapshot(1, item("d", 1)))
    w.now += 10
    w.host(a, status)
    ref = w.view.machines[a].instance_ref
    w.hosts[ref] = attrs.evolve(
        w.hosts[ref], reclaim_at=w.now + reclaim_in if reclaim_in else 0.0, rebalance_at=w.now if rebalance else 0.0
    )
    return w, a


def returns(result):
    return [(a.machine_ids, a.reason) for a in result.actions if isinstance(a, ReturnMachines)]


def test_an_idle_machine_with_a_spot_notice_is_returned_and_replaced_in_one_plan():
    w, a = noticed_world(HostStatus.IDLE)
    result = w.plan(snapshot(1, item("d", 1)))
    assert result.actions == (
        ReturnMachines("c1:p:i0:1", "p", (a,), "reclaim"),
        RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),
    )
    assert w.plan(snapshot(1, item("d", 1))).actions == ()  # replayed: both in flight, nothing new


def test_a_busy_machine_with_a_spot_notice_drains_beside_its_replacement_and_goes_before_the_deadline():
    w, a = noticed_world(HostStatus.BUSY, reclaim_in=120.0)
    notice_at = w.now
    first = w.plan(snapshot(1, item("d", 1)))
    assert first.actions == (
        DrainMachines("c1:p:i0:1", "p", (a,), "reclaim", notice_at),
        RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),
    )
    assert first.wake_at == notice_at + 120.0 - RECLAIM_MARGIN
    w.commit_actions(first.actions)
    w.now = notice_at + 120.0 - RECLAIM_MARGIN - 0.001
    assert returns(w.plan(snapshot(1, item("d", 1)))) == []  # still busy, still time
    w.now = notice_at + 120.0 - RECLAIM_MARGIN
    assert returns(w.plan(snapshot(1, item("d", 1)))) == [((a,), "reclaim_deadline")]


def test_a_draining_doomed_machine_is_returned_as_soon_as_it_goes_idle():
    w, a = noticed_world(HostStatus.BUSY, reclaim_in=120.0)
    w.commit_actions(w.plan(snapshot(1, item("d", 1))).actions)
    w.now += 20
    w.host(a, HostStatus.IDLE)
    ref = w.view.machines[a].instance_ref
    w.hosts[ref] = attrs.evolve(w.hosts[ref], reclaim_at=w.now + 100.0)
    assert returns(w.plan(snapshot(1, item("d", 1)))) == [((a,), "reclaim")]


def test_a_notice_already_past_its_margin_returns_a_busy_machine_at_once():
    w, a = noticed_world(HostStatus.BUSY, reclaim_in=RECLAIM_MARGIN / 2)
    result = w.plan(snapshot(1, item("d", 1)))
    assert returns(result) == [((a,), "reclaim_deadline")]
    assert any(isinstance(x, RequestMachines) for x in result.actions)


def test_a_rebalance_recommendation_alone_drains_and_returns_at_the_drain_timeout():
    w, a = noticed_world(HostStatus.BUSY, reclaim_in=0.0, rebalance=True)
    start = w.now
    first = w.plan(snapshot(1, item("d", 1)))
    assert [type(x) for x in first.actions] == [DrainMachines, RequestMachines]
    w.commit_actions(first.actions)
    w.now = start + DRAIN - 1
    assert returns(w.plan(snapshot(1, item("d", 1)))) == []
    w.now = start + DRAIN
    assert returns(w.plan(snapshot(1, item("d", 1)))) == [((a,), "drain_timeout")]


def test_a_lost_host_with_a_notice_is_left_to_the_ghost_rule():
    w, a = noticed_world(HostStatus.LOST)
    assert returns(w.plan(snapshot(1, item("d", 1)))) == []


@settings(max_examples=200, deadline=None)
@given(
    lead=st.floats(min_value=0.5, max_value=600.0),
    idle_after=st.one_of(st.none(), st.floats(min_value=0.0, max_value=600.0)),
    starts_busy=st.booleans(),
)
def test_a_doomed_machine_is_replaced_at_once_and_returned_before_the_deadline(lead, idle_after, starts_busy):
    """Planning at each ``wake_at`` (and when the host goes idle), the machine's replacement is asked for in the
    first plan after the notice, and its return no later than ``max(notice, reclaim_at - RECLAIM_MARGIN)``."""
    w, a = noticed_world(HostStatus.BUSY if starts_busy else HostStatus.IDLE, reclaim_in=lead)
    notice_at, reclaim_at = w.now, w.now + lead
    ref = w.view.machines[a].instance_ref
    first = w.plan(snapshot(1, item("d", 1)))
    assert any(isinstance(x, RequestMachines) and x.demand_id == "d" for x in first.actions)
    returned_at = notice_at if returns(first) else None
    w.commit_actions(first.actions)
    wake = first.wake_at
    idle_at = None if idle_after is None or not starts_busy else notice_at + idle_after
    for _ in range(10):
        if returned_at is not None:
            break
        times = [t for t in (wake, idle_at) if t is not None and t >= w.now]
        assert times, "a doomed busy machine must have a wake time"
        w.now = min(times)
        if idle_at is not None and w.now >= idle_at:
            w.host(a, HostStatus.IDLE)
            w.hosts[ref] = attrs.evolve(w.hosts[ref], reclaim_at=reclaim_at)
            idle_at = None
        result = w.plan(snapshot(1, item("d", 1)))
        w.commit_actions(result.actions)
        if returns(result):
            returned_at = w.now
        wake = result.wake_at
    assert returned_at is not None
    assert returned_at <= max(notice_at, reclaim_at - RECLAIM_MARGIN)
