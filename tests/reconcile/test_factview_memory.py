"""What the daemon's view holds at 100,000 machines (issue 18): one copy of each string, facts folded page by page."""

import heapq

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import EPOCH, token_hash

from provisionerd.controller.view import ControllerView, ResyncCollector
from provisionerd.domain.model import (
    NO_QUOTE,
    CommittedFact,
    HostState,
    HostStatus,
    InstanceFact,
    PriceQuote,
    RequestFailed,
    RequestIntent,
)
from provisionerd.planner import host_table
from provisionerd.planner.fact_view import MachineRecord, fold
from provisionerd.wire.codec import decode, encode
from provisionerd.wire.messages import ResyncPage


def _facts(op: str, count: int, start: int) -> list[CommittedFact]:
    refs = tuple(f"{op}/{i}" for i in range(count))
    intent = RequestIntent("p", EPOCH, op, "t", count, refs, tuple(map(token_hash, refs)), "d1")
    machines = [
        InstanceFact("p", EPOCH, op, ref, f"{op}-m{i}", "t", token_hash(ref)) for i, ref in enumerate(reversed(refs))
    ]
    return [CommittedFact(start + i, f) for i, f in enumerate([intent, *machines])]


def test_a_machine_shares_its_ref_with_its_intent_after_decoding() -> None:
    page = decode(encode(ResyncPage(0, 1, tuple(_facts("op1", 3, 1)), ()))).msg
    collector = ResyncCollector()
    assert collector.add(0, 1, page.facts, page.hosts)
    view = collector.build(1, "ctl0", 1).facts
    intent = view.intents["op1"].intent
    for machine in view.machines.values():
        i = intent.instance_refs.index(machine.instance_ref)
        assert machine.instance_ref is intent.instance_refs[i]
        assert machine.op_id is intent.op_id and machine.provider is intent.provider  # interned by the codec


def test_an_intent_keeps_its_token_hashes_while_open_and_drops_them_when_its_op_closes() -> None:
    """A join token's hash is read here only to commit the instance fact of a machine an open op makes (recovery
    reads the view's intent for that): an op fulfilled or failed makes none, and its hashes go (12.8 MB at 100k)."""
    facts = _facts("op1", 3, 1)
    view = fold(facts[:3])  # the intent and two of its three machines
    hashes = tuple(token_hash(ref) for ref in view.intents["op1"].intent.instance_refs)
    assert view.intents["op1"].open and view.intents["op1"].intent.token_hashes == hashes
    assert "op1" in view.open_ops
    fold(facts[3:], view)  # the third machine: fulfilled
    closed = view.intents["op1"].intent
    assert not view.intents["op1"].open and closed.token_hashes == ()
    assert attrs.evolve(closed, token_hashes=hashes) == facts[0].fact  # nothing else of it changed
    assert "op1" not in view.open_ops

    failed = _facts("op2", 3, 10)
    view = fold([*failed[:2], CommittedFact(20, RequestFailed("p", EPOCH, "op2", "partial: 1 of 3"))])
    assert view.intents["op2"].failed_reason and view.intents["op2"].intent.token_hashes == ()
    fold([CommittedFact(21, failed[2].fact)], view)  # a late machine of the failed op still folds, with its ref
    assert view.machines["op2-m1"].instance_ref == "op2/1"
    assert view.intents["op2"].machine_ids == ["op2-m0", "op2-m1"]

    empty = RequestIntent("p", EPOCH, "op3", "t", 0, (), ())
    assert fold([CommittedFact(30, empty)]).intents["op3"].intent is empty  # nothing to drop


def test_a_full_resync_is_folded_page_by_page_and_forgets_the_pages_it_folded() -> None:
    first, second = _facts("op1", 2, 1), _facts("op2", 2, 10)
    collector = ResyncCollector()
    assert not collector.add(1, 3, tuple(second), ())  # early: waits for page 0
    assert collector._view is not None and not collector._view.machines
    assert not collector.add(0, 3, tuple(first), ())
    assert set(collector._view.machines) == {"op1-m0", "op1-m1", "op2-m0", "op2-m1"}
    assert collector._pages[0] == ((), ()) and collector._pages[1] == ((), ())
    assert collector.add(2, 3, (), ())
    view = collector.build(1, "ctl0", 1)
    assert view.facts.last_index == 12 and view.facts.open_ops == {}


def _machines(view) -> dict[str, tuple[str, str]]:
    return {m: (r.instance_ref, r.state.value) for m, r in view.machines.items()}


def test_a_full_resync_folded_in_steps_of_any_size_is_the_view_folded_at_once() -> None:
    pages = [_facts("op1", 7, 1), _facts("op2", 3, 20), [], _facts("op3", 5, 40)]
    at_once = ResyncCollector()
    for i in (1, 0, 3, 2):
        at_once.add(i, len(pages), tuple(reversed(pages[i])), ())
    expected = at_once.build(1, "ctl0", 1).facts
    for limit in (1, 2, 3, 100):
        stepped = ResyncCollector()
        for i in (1, 0, 3, 2):  # page 1 waits for page 0; page 3 for page 2
            stepped.add(i, len(pages), tuple(reversed(pages[i])), (), fold=False)
            while stepped.fold_step(limit):
                pass
        view = stepped.build(1, "ctl0", 1).facts
        assert _machines(view) == _machines(expected) and view.last_index == expected.last_index == 45
        assert stepped._pages == {i: ((), ()) for i in range(len(pages))}


def test_one_fold_step_folds_at_most_its_limit_of_facts() -> None:
    collector = ResyncCollector()
    collector.add(0, 1, tuple(_facts("op1", 9, 1)), (), fold=False)  # 10 facts: the intent and its 9 machines
    assert collector._view is None  # nothing folded on add
    assert collector.fold_step(4) and collector._view is not None and collector._view.last_index == 4
    assert collector.fold_step(4) and collector._view.last_index == 8
    assert not collector.fold_step(4) and collector._view.last_index == 10
    assert not collector.fold_step(4)


def test_a_machine_holds_its_intents_price_quote_not_a_decoded_copy() -> None:
    """Every machine of an intent is chosen at the intent's quote: after decoding, each machine holds the intent's
    quote object (and an unpriced one ``NO_QUOTE``), not ~100 bytes of its own; a machine quoted otherwise keeps
    its own."""
    quote = PriceQuote(0.5, "USD", "hour", "list", "2026-01-01T00:00:00Z")
    refs = ("q/0", "q/1", "q/2")
    intent = RequestIntent("p", EPOCH, "q", "t", 3, refs, tuple(map(token_hash, refs)), "d1", price=quote)
    other = PriceQuote(0.75, "USD", "hour", "spot", "2026-01-01T00:00:00Z")
    machines = [
        InstanceFact("p", EPOCH, "q", ref, f"q-m{i}", "t", token_hash(ref), price=other if i == 2 else quote)
        for i, ref in enumerate(refs)
    ]
    unpriced = _facts("op1", 2, 10)
    facts = (CommittedFact(1, intent), *(CommittedFact(2 + i, m) for i, m in enumerate(machines)), *unpriced)
    page = decode(encode(ResyncPage(0, 1, facts, ()))).msg
    collector = ResyncCollector()
    assert collector.add(0, 1, page.facts, page.hosts)
    view = collector.build(1, "ctl0", 1).facts
    held = view.intents["q"].intent.price
    assert held == quote and view.machines["q-m0"].price is held and view.machines["q-m1"].price is held
    assert view.machines["q-m2"].price == other and view.machines["q-m2"].price is not held
    assert all(view.machines[f"op1-m{i}"].price is NO_QUOTE for i in range(2))


@given(
    st.lists(
        st.tuples(st.sampled_from([1.0, 5.0, 7.5]), st.sampled_from("abc"), st.sampled_from("xyz")),
        min_size=1,
        max_size=30,
    )
)
def test_records_order_as_the_launch_time_heaps_tuples_did(keys) -> None:
    """``host_table``'s heaps hold the records themselves: a heap of records pops them in the order a heap of
    ``(launch_time, instance_ref, machine_id)`` tuples did, ties included (only launch times ``> 0`` enter them)."""
    records = [
        MachineRecord(
            provider="p",
            machine_id=m,
            instance_ref=r,
            op_id="o",
            template_id="t",
            hostname="",
            address="",
            launch_time=t,
        )
        for t, r, m in keys
    ]
    by_tuple = [(m.launch_time, m.instance_ref, m.machine_id) for m in records]
    heap, tuples = list(records), list(by_tuple)
    heapq.heapify(heap)
    heapq.heapify(tuples)
    popped = [heapq.heappop(heap) for _ in records]
    expected = [heapq.heappop(tuples) for _ in by_tuple]
    assert [(m.launch_time, m.instance_ref, m.machine_id) for m in popped] == expected


def _hosts(facts: list[CommittedFact], report: dict[str, str], *, status=HostStatus.IDLE) -> tuple[HostState, ...]:
    """A host per instance fact, decoded from a resync page as the daemon gets it (its own copy of every string)."""
    hosts = tuple(
        HostState(f.fact.instance_ref, "p", f.fact.machine_id, status, 100.0, capabilities=dict(report))
        for f in facts
        if isinstance(f.fact, InstanceFact)
    )
    return decode(encode(ResyncPage(0, 1, (), hosts))).msg.hosts


def test_a_stored_host_shares_its_machines_strings_and_an_equal_report() -> None:
    """At 100,000 joined machines each host's own copies of its ref, id, name, address and report cost ~45 MB."""
    facts = _facts("op1", 3, 1)
    view = fold(facts)
    report = {"ncpus": "8", "mem": "32000", "type": "X86_64"}
    hosts = _hosts(facts, report)
    collector_view = ControllerView(1, "ctl0", 1, view, view.hosts)
    collector_view.apply_hosts(hosts)
    stored = [view.hosts[h.instance_ref] for h in hosts]
    assert stored == list(hosts)  # equal in every field
    for host in stored:
        machine = view.machines[host.machine_id]
        assert host.instance_ref is machine.instance_ref and host.machine_id is machine.machine_id
        assert host.capabilities is stored[0].capabilities  # one report for the three
        assert any(ref is machine.instance_ref for ref in collector_view.joined)  # the joined set keeps that one too
    other = _hosts(facts, {**report, "mem": "64000"})[0]
    view.hosts[other.instance_ref] = other
    assert view.hosts[other.instance_ref].capabilities == other.capabilities  # not the other report
    assert view.hosts[other.instance_ref].capabilities is not stored[0].capabilities


def test_reports_beyond_the_shared_ones_are_kept_as_they_came(monkeypatch) -> None:
    monkeypatch.setattr(host_table, "SHARED_REPORTS", 1)
    facts = _facts("op1", 2, 1)
    view = fold(facts)
    first, second = _hosts(facts, {"ncpus": "8"})
    view.hosts[first.instance_ref] = first
    odd = attrs.evolve(second, capabilities={"ncpus": "4"})
    view.hosts[odd.instance_ref] = odd
    assert view.hosts[odd.instance_ref].capabilities is odd.capabilities  # the table shares one report at most
    orphan = HostState("ghost/0", "p", "g-0", HostStatus.IDLE, 1.0, capabilities={"ncpus": "8"})
    view.hosts[orphan.instance_ref] = orphan  # no machine of the view: only its report is shared
    assert view.hosts["ghost/0"] == orphan and view.hosts["ghost/0"].capabilities is first.capabilities
