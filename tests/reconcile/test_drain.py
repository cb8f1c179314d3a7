"""Hard max TTL with drain (issue 20, item 4), on the pure planner: a busy machine past ``max_ttl`` is asked to
drain, then returned when it goes idle or at ``drain_timeout``, whichever comes first (``planner.drain``)."""

from reconcile_world import item, offer, snapshot
from test_plan import QUOTE, running, world

from provisionerd.domain.actions import DrainMachines, RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus
from provisionerd.planner.deadlines import PLAN_SLACK
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import PlannerState

TTL, DRAIN = 3600.0, 600.0


def returns(result):
    return [(a.machine_ids, a.reason) for a in result.actions if isinstance(a, ReturnMachines)]


def aged_busy(n: int = 1, **own):
    """A world with ``n`` busy machines for item d at provider p (``own``: more of p's knobs), just past max_ttl."""
    w = world()
    w.policy = Policy(cluster="c1", providers={"p": ProviderPolicy(max_ttl=TTL, drain_timeout=DRAIN, **own)})
    made = running(w, snapshot(1, item("d", n)))
    start = w.now
    w.now = start + TTL
    return w, made, start


def test_a_busy_machine_past_max_ttl_is_asked_to_drain_once_and_replaced():
    w, (a,), start = aged_busy()
    first = w.plan(snapshot(1, item("d", 1)))
    assert first.actions == (DrainMachines("c1:p:i0:1", "p", (a,), "max_ttl", start + TTL),)
    assert first.wake_at == start + TTL + DRAIN  # the loop wakes at the drain deadline
    # Draining, it is no supply for new work: its item gets a replacement; the machine itself stays, and the
    # replayed snapshot does not ask again (asked already, in memory until the fact lands).
    replay = w.plan(snapshot(1, item("d", 1)))
    assert replay.actions == (RequestMachines("c1:p:i0:2", "p", "t", 1, "d", price=QUOTE),)
    w.commit_actions(first.actions)
    assert w.view.machines[a].drain_since == start + TTL
    w.now += 1
    assert w.plan(snapshot(1, item("d", 1))).actions == ()


def test_idle_first_a_draining_machine_is_returned_as_soon_as_it_goes_idle():
    w, (a,), start = aged_busy()
    w.commit_actions(w.plan(snapshot(1, item("d", 1))).actions)
    w.now = start + TTL + 100
    assert [type(x) for x in w.plan(snapshot(1, item("d", 1))).actions] == [RequestMachines]  # still busy
    w.host(a, HostStatus.IDLE)
    result = w.plan(snapshot(1, item("d", 1)))
    assert result.actions == (ReturnMachines("c1:p:i0:3", "p", (a,), "drained"),)


def test_drain_timeout_first_a_machine_still_busy_is_returned_anyway():
    w, (a,), start = aged_busy()
    w.commit_actions(w.plan(snapshot(1, item("d", 1))).actions)
    w.now = start + TTL + DRAIN - 0.001
    before = w.plan(snapshot(1, item("d", 1)))
    assert not any(isinstance(x, ReturnMachines) for x in before.actions)
    assert before.wake_at == start + TTL + DRAIN
    w.now = start + TTL + DRAIN
    result = w.plan(snapshot(1, item("d", 1)))
    assert ReturnMachines("c1:p:i0:3", "p", (a,), "drain_timeout") in result.actions


def test_a_restarted_daemon_keeps_the_drain_and_its_clock_from_the_fact():
    w, (a,), start = aged_busy()
    w.commit_actions(w.plan(snapshot(1, item("d", 1))).actions)
    w.now = start + TTL + 300
    w.state = PlannerState.initial("i1")  # a restart: the planner's memory is gone, the facts are not
    after = w.plan(snapshot(1, item("d", 1)))
    assert not any(isinstance(x, (DrainMachines, ReturnMachines)) for x in after.actions)  # not asked again
    assert after.wake_at == start + TTL + DRAIN  # the same deadline, not 600 s from the restart
    w.now = start + TTL + DRAIN
    assert ReturnMachines("c1:p:i1:1", "p", (a,), "drain_timeout") in w.plan(snapshot(1, item("d", 1))).actions


def test_a_drain_whose_fact_never_lands_is_kept_in_memory_and_still_times_out():
    """A controller that refuses the fact (or does not know it) is not asked again by this process, and the
    machine is returned at drain_timeout anyway; a lost snapshot (no demand) changes nothing."""
    w, (a,), start = aged_busy()
    (drain,) = w.plan(snapshot(1, item("d", 1))).actions
    w.drop(drain.op_id)
    w.now = start + TTL + 1
    assert not any(isinstance(x, DrainMachines) for x in w.plan(None).actions)
    w.now = start + TTL + DRAIN
    assert returns(w.plan(None)) == [((a,), "drain_timeout")]


def test_a_restart_before_the_fact_lands_asks_again_and_never_returns_early():
    w, (a,), start = aged_busy()
    w.plan(snapshot(1, item("d", 1)))  # asked, never committed
    w.now = start + TTL + 500
    w.state = PlannerState.initial("i1")
    again = w.plan(snapshot(1, item("d", 1)))
    assert again.actions == (DrainMachines("c1:p:i1:0", "p", (a,), "max_ttl", start + TTL + 500),)
    w.now = start + TTL + DRAIN  # 600 s after the first ask, only 100 s after the second: still busy, kept
    assert not any(isinstance(x, ReturnMachines) for x in w.plan(snapshot(1, item("d", 1))).actions)


def test_the_disruption_budget_paces_the_drain_requests_not_the_drain_timeouts():
    w, made, start = aged_busy(3, disruption_budget=1, disruption_interval=60.0)
    first = w.plan(snapshot(1, item("d", 3)))
    assert first.actions == (DrainMachines("c1:p:i0:1", "p", (made[0],), "max_ttl", start + TTL),)
    assert first.wake_at == start + TTL + 60.0  # the window frees room
    assert [n.kind for n in first.notes] == ["deferred"]
    w.commit_actions(first.actions)
    w.now = start + TTL + 60.0
    second = w.plan(snapshot(1, item("d", 3)))
    assert [a for a in second.actions if isinstance(a, DrainMachines)] == [
        DrainMachines(second.actions[0].op_id, "p", (made[1],), "max_ttl", start + TTL + 60.0)
    ]
    w.commit_actions(second.actions)
    # The first machine's drain timeout comes while the budget is spent on the others: it is returned anyway.
    w.now = start + TTL + DRAIN
    w.state = attrs_evolve_disruptions(w.state, ((w.now, "p", 1),))  # a full window right now
    returns = [a for a in w.plan(snapshot(1, item("d", 3))).actions if isinstance(a, ReturnMachines)]
    assert [(r.machine_ids, r.reason) for r in returns] == [((made[0],), "drain_timeout")]


def attrs_evolve_disruptions(state: PlannerState, log: tuple[tuple[float, str, int], ...]) -> PlannerState:
    import attrs

    return attrs.evolve(state, disruptions=log)


def test_an_idle_machine_past_max_ttl_is_still_returned_at_once_and_budgeted():
    w, (a,), start = aged_busy(disruption_budget=0)
    w.host(a, HostStatus.IDLE)
    result = w.plan(snapshot(1, item("d", 1)))
    assert not any(isinstance(x, ReturnMachines) for x in result.actions)  # budget 0: voluntary, held
    assert "deferred" in [n.kind for n in result.notes]


def test_each_provider_has_its_own_drain_timeout():
    policy = Policy(
        cluster="c1",
        providers={
            "p": ProviderPolicy(max_ttl=TTL, drain_timeout=60.0),
            "q": ProviderPolicy(max_ttl=TTL, drain_timeout=900.0),
        },
    )
    w = world(offer("p", "t", price=0.1), offer("q", "t", price=0.2))
    w.policy = policy
    (a,) = running(w, snapshot(1, item("d", 1, providers=("p",))))
    (b,) = running(w, snapshot(2, item("d", 1, providers=("p",)), item("e", 1, providers=("q",))))
    start = w.now
    w.now = start + TTL
    w.commit_actions(w.plan(snapshot(2, item("d", 1, providers=("p",)), item("e", 1, providers=("q",)))).actions)
    w.now = start + TTL + 60.0
    snap = snapshot(2, item("d", 1, providers=("p",)), item("e", 1, providers=("q",)))
    result = w.plan(snap)
    assert [(r.machine_ids, r.reason) for r in result.actions if isinstance(r, ReturnMachines)] == [
        ((a,), "drain_timeout")
    ]
    assert result.wake_at is not None and result.wake_at <= start + TTL + 900.0 + PLAN_SLACK


def test_the_plan_wakes_at_the_next_max_ttl_and_reads_only_machines_past_the_shortest():
    w, (a,), start = aged_busy()
    w.now = start + TTL - 10.0
    early = w.plan(snapshot(1, item("d", 1)))
    assert early.actions == () and early.wake_at == start + TTL
    # The same world through a plain dict of hosts (one pass over every machine) plans the same.
    plain = dict(w.hosts)
    w.now = start + TTL
    again = plan_with(w, plain)
    assert again.actions == (DrainMachines("c1:p:i0:1", "p", (a,), "max_ttl", start + TTL),)


def plan_with(w, hosts):
    from provisionerd.planner.plan import plan

    return plan(w.state, snapshot(1, item("d", 1)), w.view, w.offers, hosts, w.now, w.policy)
