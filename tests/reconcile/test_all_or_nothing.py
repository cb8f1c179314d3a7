"""All-or-nothing demand items in the pure planner (issue 35 item 5, ``planner.gang``): one offer, one op, never
split; only providers that can say it; a partial answer returned whole, durable through the facts."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import World, fuzz_settings, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.model import HostStatus, RequestFailed
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.gang import ALL_OR_NOTHING
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.planner.state import PlannerState


def gang(demand_id: str = "mpi", count: int = 4, **shape: int):
    return attrs.evolve(item(demand_id, count, ncpus=shape.pop("ncpus", 2), **shape), all_or_nothing=True)


def world(*offers, step: int | None = None, cap: int | None = None, providers=("p",)) -> World:
    own = {name: ProviderPolicy(step_limit=step, max_machines=cap) for name in providers}
    return World(list(offers), policy=Policy(cluster="c1", providers=own), gang=frozenset(providers))


def requests(result) -> list[RequestMachines]:
    return [a for a in result.actions if isinstance(a, RequestMachines)]


def returns(result) -> list[ReturnMachines]:
    return [a for a in result.actions if isinstance(a, ReturnMachines)]


def two_offers(small: int = 3):
    """``small`` is the cheaper and cannot hold 4; ``large`` can."""
    return offer(template="small", max_number=small, price=0.1), offer(template="large", max_number=10, price=0.2)


def test_the_whole_deficit_goes_to_the_first_offer_with_room_for_all_of_it_in_one_request() -> None:
    w = world(*two_offers())
    (asked,) = requests(w.plan(snapshot(1, gang())))
    assert (asked.template_id, asked.count, asked.all_or_nothing) == ("large", 4, True)
    # Without the flag the same item fills the cheaper offer first and spills over: split.
    plain = world(*two_offers())
    split = sorted((a.template_id, a.count) for a in requests(plain.plan(snapshot(1, item("mpi", 4, ncpus=2)))))
    assert split == [("large", 1), ("small", 3)]


def test_no_offer_with_room_for_all_asks_nothing_and_says_what_held_each() -> None:
    w = world(offer(template="small", max_number=3), offer(template="other", max_number=2, price=0.3))
    result = w.plan(snapshot(1, gang()))
    assert requests(result) == []
    (note,) = [n for n in result.notes if n.kind == "unmet_demand"]
    assert "all or nothing, and no offer has room for all 4" in note.detail
    assert "maxNumber 3" in note.detail and "maxNumber 2" in note.detail
    assert note.rules == ("max_number",)
    (decision,) = result.decisions
    assert decision.unmet == 4 and decision.requested == () and len(decision.filled) == 2


def test_a_provider_whose_plugin_cannot_say_it_is_incompatible() -> None:
    w = world(offer("p", "t", price=0.2), offer("q", "t", price=0.1), providers=("p",))  # q: no allOrNothing
    (asked,) = requests(w.plan(snapshot(1, gang())))
    assert asked.provider == "p"
    (decision,) = w.plan(snapshot(2, gang("other"))).decisions
    (rejected,) = decision.incompatible
    assert rejected.provider == "q" and "cannot launch all or nothing" in rejected.reasons[0]
    none = World([offer("q", "t")])  # no provider can: an incompatible note, nothing asked
    result = none.plan(snapshot(1, gang()))
    assert requests(result) == [] and result.notes[-1].rules == ("incompatible",)


def test_a_gang_larger_than_the_step_limit_goes_alone_into_an_empty_window() -> None:
    w = world(offer(max_number=100), step=2)
    (first,) = requests(w.plan(snapshot(1, gang(count=5))))
    assert first.count == 5
    w.commit_actions([first])
    w.now += 1
    result = w.plan(snapshot(2, gang(count=5), gang("second", count=5)))
    assert requests(result) == []  # the window holds the first: the second waits for room
    assert any("provider step limit 2" in n.detail for n in result.notes)
    w.now += w.policy.step_interval + 1
    (second,) = requests(w.plan(snapshot(3, gang(count=5), gang("second", count=5))))
    assert (second.demand_id, second.count) == ("second", 5)


def test_a_partial_answer_is_returned_whole_busy_members_when_idle_and_a_restart_returns_the_same() -> None:
    w = world(offer(max_number=100))
    (asked,) = requests(w.plan(snapshot(1, gang())))
    w.commit_actions([asked])
    made = w.fulfil(asked.op_id, 3)
    w.commit(RequestFailed("p", w.view.intents[asked.op_id].intent.epoch, asked.op_id, "partial: 3 of 4"))
    w.host(made[0], HostStatus.BUSY)  # the controller placed other work on one meanwhile
    w.host(made[1], HostStatus.IDLE)
    w.now += 1
    result = w.plan(snapshot(1, gang()))
    (back,) = returns(result)
    assert back.reason == ALL_OR_NOTHING and sorted(back.machine_ids) == sorted(made[1:])
    (again,) = requests(result)  # none of the 3 is supply: the whole 4 again, as a new op
    assert again.count == 4 and again.op_id != asked.op_id
    # A fresh daemon: a new planner state and a view rebuilt from the facts alone returns the same machines.
    view = FactView()
    for committed in w.facts:
        view.apply(committed)
    fresh = attrs.evolve(w, state=PlannerState.initial("i1"), view=view, hosts=dict(w.hosts), under_way={})
    (same,) = returns(fresh.plan(snapshot(1, gang())))
    assert sorted(same.machine_ids) == sorted(made[1:])
    # The busy one goes once idle.
    w.commit_actions(result.actions)
    w.host(made[0], HostStatus.IDLE)
    w.now += 1
    (last,) = returns(w.plan(snapshot(1, gang())))
    assert last.machine_ids == (made[0],) and last.reason == ALL_OR_NOTHING


def test_a_whole_op_keeps_its_machines_and_a_lost_member_is_replaced_alone() -> None:
    w = world(offer(max_number=100))
    (asked,) = requests(w.plan(snapshot(1, gang())))
    w.commit_actions([asked])
    for machine_id in w.fulfil(asked.op_id):
        w.host(machine_id, HostStatus.IDLE)
    w.now += 1
    assert w.plan(snapshot(1, gang())).actions == () and w.view.broken_gangs == {}


@fuzz_settings(200)
@given(
    rooms=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    count=st.integers(1, 12),
    step=st.one_of(st.none(), st.integers(1, 6)),
    cap=st.one_of(st.none(), st.integers(1, 20)),
)
def test_an_all_or_nothing_item_is_asked_whole_of_one_offer_with_room_or_not_at_all(rooms, count, step, cap) -> None:
    offers = [offer(template=f"t{i}", max_number=room, price=0.1 * (i + 1)) for i, room in enumerate(rooms)]
    w = world(*offers, step=step, cap=cap)
    result = w.plan(snapshot(1, gang(count=count)))
    asked = requests(result)
    fits = [o for o in offers if o.max_number >= count and (cap is None or cap >= count)]
    if not fits:
        assert asked == []
        return
    (one,) = asked  # an empty step window always lets one whole request through
    assert one.count == count and one.all_or_nothing
    assert one.template_id == fits[0].template_id  # the first in choice order (price) with room for all
