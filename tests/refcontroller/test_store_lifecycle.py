"""History apart from state (issue 18 item 1): ended lifecycles leave the resync set, stay in the log."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path

import attrs
import pytest
from rc_factories import before_row_checksums

from provisionerd.domain.model import (
    CommittedFact,
    Epoch,
    Fact,
    HostState,
    HostStatus,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.planner.fact_view import FactView, fold
from refcontroller.cluster import Cluster
from refcontroller.commits import Rejection
from refcontroller.leases import Granted
from refcontroller.store import FactStore

P = "aws"
E = Epoch(1, 1)


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def intent(op: str, *refs: str) -> RequestIntent:
    return RequestIntent(P, E, op, "t", len(refs), refs, tuple(_h(r) for r in refs), "d")


def instance(op: str, ref: str, machine: str) -> InstanceFact:
    return InstanceFact(P, E, op, ref, machine, "t", _h(ref))


def resync_set(store: FactStore) -> list[CommittedFact]:
    last = store.last_index()
    return store.facts([P], 1, last, as_of=last)


def resync_indexes(store: FactStore) -> list[int]:
    return [c.index for c in resync_set(store)]


def test_a_returned_machine_leaves_the_resync_set_and_stays_in_history() -> None:
    store = FactStore.open(":memory:")
    for fact in (
        intent("r1", "a"),
        instance("r1", "a", "m1"),
        ReturnIntent(P, E, "x1", ("m1",), "idle"),
        Returned(P, E, "x1", ("m1",)),
    ):
        store.append(fact, "d")
    assert store.ended_refs == ("a",)
    assert resync_indexes(store) == [4]  # only the provider's latest fact: its epoch and index
    assert store.live_count() == 0
    history = store.history(P)
    assert [(row.index, row.ended_at) for row in history] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert store.history(P, after=2, limit=1)[0].index == 3
    assert store.instance_ended("a") and not store.instance_ended("b")


def test_a_failed_intent_without_machines_ends_with_its_failure() -> None:
    store = FactStore.open(":memory:")
    store.append(intent("r1", "a", "b"), "d")
    store.append(intent("r2", "c"), "d")
    store.append(RequestFailed(P, E, "r1", "capacity"), "d")
    assert resync_indexes(store) == [2, 3]


def test_a_machine_keeps_its_op_live_while_a_sibling_lives() -> None:
    store = FactStore.open(":memory:")
    for fact in (
        intent("r1", "a", "b"),
        instance("r1", "a", "m1"),
        instance("r1", "b", "m2"),
        ReturnIntent(P, E, "x1", ("m1",), "idle"),
        Returned(P, E, "x1", ("m1",)),
    ):
        store.append(fact, "d")
    assert resync_indexes(store) == [1, 2, 3, 4, 5]  # m1's return must stay: its instance fact is resent
    store.append(Lost(P, E, "l1", "m2", "reclaimed"), "d")
    assert resync_indexes(store) == [6]
    assert store.ended_refs == ("a", "b")


def test_a_return_of_two_ops_ends_when_both_origins_ended() -> None:
    store = FactStore.open(":memory:")
    for fact in (
        intent("r1", "a"),
        instance("r1", "a", "m1"),
        intent("r2", "b", "c"),
        instance("r2", "b", "m2"),
        ReturnIntent(P, E, "x1", ("m1", "m2"), "idle"),
        Returned(P, E, "x1", ("m1", "m2")),
    ):
        store.append(fact, "d")
    assert resync_indexes(store) == [3, 4, 5, 6]  # r2 is still open (c has not come): its m2 needs x1
    store.append(RequestFailed(P, E, "r2", "timeout"), "d")
    assert resync_indexes(store) == [7]


def test_a_resync_fixed_before_an_end_still_sends_what_was_live() -> None:
    store = FactStore.open(":memory:")
    store.append(intent("r1", "a"), "d")
    store.append(instance("r1", "a", "m1"), "d")
    as_of = store.last_index()
    store.append(Lost(P, E, "l1", "m1", "gone"), "d")
    assert [c.index for c in store.facts([P], 1, 3, as_of=as_of)] == [1, 2]


def test_reports_and_adoptions() -> None:
    store = FactStore.open(":memory:")
    store.append(OrphanReported(P, E, "o1", "z", "ghost", "{}"), "d")  # an open finding: live
    store.append(OrphanReported(P, E, "o2", "y", "tagged_unknown", "{}"), "d")
    store.append(OrphanAdopted(P, E, "ad1", "y", "ry"), "d")
    assert resync_indexes(store) == [1, 2, 3]
    store.append(Lost(P, E, "l1", "y", "gone"), "d")
    assert resync_indexes(store) == [1, 4]
    assert store.ended_refs == ("ry",)


def test_a_late_machine_of_a_failed_op_lives_on_its_own() -> None:
    store = FactStore.open(":memory:")
    store.append(intent("r1", "a"), "d")
    store.append(RequestFailed(P, E, "r1", "timeout"), "d")
    assert resync_indexes(store) == [2]
    store.append(instance("r1", "a", "m1"), "d")
    assert resync_indexes(store) == [3]
    view = fold(resync_set(store))
    assert view.machines["m1"].state.live and view.open_ops == {}
    store.append(Lost(P, E, "l1", "m1", "gone"), "d")
    assert resync_indexes(store) == [4]


def _summary(view: FactView) -> dict[str, object]:
    """What the daemon derives from facts and acts on (the live part of its view)."""
    machines = {
        m.machine_id: (m.state, m.instance_ref, m.template_id, m.return_op, m.adopted)
        for m in view.machines.values()
        if m.state.live
    }
    return {
        "machines": machines,
        "open": {op: (view.intents[op].intent, tuple(view.intents[op].machine_ids)) for op in view.open_ops},
        "returns": sorted(
            op
            for op, r in view.returns.items()
            if not r.done
            and any(view.machines.get(m) is not None and view.machines[m].state.live for m in r.intent.machine_ids)
        ),
        "orphans": {m: r for m, r in view.reported_orphans.items() if m not in view.machines},
        "epochs": dict(view.latest_epoch),
        "last_index": view.last_index,
        "active_refs": set(view.active_refs),
        "by_offer": {k: v for k, v in view.live_by_offer.items() if v},
        "by_demand": {k: v for k, v in view.active_by_demand.items() if v},
    }


def _random_facts(rng: random.Random, n: int) -> list[Fact]:
    facts: list[Fact] = []
    open_ops: dict[str, list[str]] = {}  # op -> refs not yet made
    active: dict[str, str] = {}  # machine -> op
    returning: dict[str, tuple[str, ...]] = {}
    counter = 0
    epoch = Epoch(1, 1)
    for _ in range(n):
        counter += 1
        if rng.random() < 0.05:
            epoch = Epoch(epoch.term, epoch.seq + 1)
        roll = rng.random()
        if roll < 0.2 or not (open_ops or active or returning):
            refs = [f"ref{counter}-{k}" for k in range(rng.randint(1, 3))]
            open_ops[f"op{counter}"] = refs
            facts.append(RequestIntent(P, epoch, f"op{counter}", "t", len(refs), tuple(refs), tuple(map(_h, refs))))
        elif roll < 0.45 and open_ops:
            op = rng.choice(sorted(open_ops))
            ref = open_ops[op].pop(0)
            if not open_ops[op]:
                del open_ops[op]
            active[f"m{counter}"] = op
            facts.append(InstanceFact(P, epoch, op, ref, f"m{counter}", "t", _h(ref)))
        elif roll < 0.5 and open_ops:
            op = rng.choice(sorted(open_ops))
            del open_ops[op]
            facts.append(RequestFailed(P, epoch, op, "timeout"))
        elif roll < 0.65 and active:
            ms = tuple(rng.sample(sorted(active), min(len(active), rng.randint(1, 2))))
            for m in ms:
                del active[m]
            returning[f"x{counter}"] = ms
            facts.append(ReturnIntent(P, epoch, f"x{counter}", ms, "idle"))
        elif roll < 0.8 and returning:
            op = rng.choice(sorted(returning))
            facts.append(Returned(P, epoch, op, returning.pop(op)))
        elif roll < 0.87 and active:
            m = rng.choice(sorted(active))
            del active[m]
            facts.append(Lost(P, epoch, f"l{counter}", m, "reclaimed"))
        elif roll < 0.93:
            m = rng.choice([f"u{counter}", *sorted(active)[:1]])
            facts.append(OrphanReported(P, epoch, f"o{counter}", m, "ghost", "{}"))
        elif roll < 0.97:
            active[f"u{counter}"] = f"ad{counter}"
            facts.append(OrphanAdopted(P, epoch, f"ad{counter}", f"u{counter}", f"uref{counter}"))
        elif returning:  # a machine lost while its return is under way
            op = rng.choice(sorted(returning))
            facts.append(Lost(P, epoch, f"l{counter}", returning[op][0], "reclaimed"))
    return facts


@pytest.mark.sweep
def test_the_resync_set_gives_the_daemon_what_the_whole_log_gives() -> None:
    """The property the daemon relies on: folding only the resync set derives the same live state (machines, open
    intents, pending returns, findings, latest epoch, last index) as folding every fact ever committed."""
    for seed in range(60):
        rng = random.Random(seed)
        store = FactStore.open(":memory:")
        facts = _random_facts(rng, rng.randint(20, 200))
        for i, fact in enumerate(facts):
            store.append(fact, "d")
            if i % 17 == 0 or i == len(facts) - 1:
                whole = fold(store.facts([P], 1, store.last_index()))
                live = fold(resync_set(store))
                assert _summary(live) == _summary(whole), f"seed {seed} after fact {i + 1}"
        assert len(resync_set(store)) <= 1 + sum(1 for row in store.history(P, limit=10_000) if row.ended_at == 0)


def test_bulk_append_tracks_lifecycles_too() -> None:
    store = FactStore.open(":memory:")
    store.append_many([intent("r1", "a"), instance("r1", "a", "m1"), Lost(P, E, "l1", "m1", "x")], "d")
    assert resync_indexes(store) == [3]


def test_a_store_written_before_lifecycles_is_replayed_once(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    store = FactStore.open(path)
    store.append(intent("r1", "a"), "d")
    store.append(instance("r1", "a", "m1"), "d")
    store.append(Lost(P, E, "l1", "m1", "x"), "d")
    store.append(intent("r2", "b"), "d")
    store.close()
    conn = sqlite3.connect(path)  # what an older controller left: no lifecycle tables, no ended_at, no checksums
    before_row_checksums(conn)
    conn.executescript(
        "DROP INDEX facts_live; ALTER TABLE facts DROP COLUMN ended_at; DROP TABLE lifecycle_ops;"
        " DROP TABLE lifecycle_machines; DROP TABLE lifecycle_members; DROP TABLE lifecycle_mentions;"
    )
    conn.close()
    store = FactStore.open(path)
    assert resync_indexes(store) == [4]
    store.close()


def test_the_controller_drops_the_hosts_of_ended_machines_and_refuses_their_rejoin(cluster: Cluster) -> None:
    granted = cluster.acquire(cluster.replicas.primary, P, "d1", 40.0)
    assert isinstance(granted, Granted), granted
    epoch = granted.lease.epoch
    cluster.hosts.add(HostState("a", P, "m1", HostStatus.IDLE, 1.0))
    cluster.hosts.add(HostState("b", P, "m2", HostStatus.IDLE, 1.0))
    facts: list[Fact] = [intent("r1", "a", "b"), instance("r1", "a", "m1"), instance("r1", "b", "m2")]
    facts.append(Lost(P, E, "l1", "m1", "gone"))
    for fact in facts:
        committed = cluster.commit(cluster.replicas.primary, attrs.evolve(fact, epoch=epoch), "d1", 41.0)
        assert isinstance(committed, CommittedFact), committed
    assert cluster.hosts.get("a") is not None  # m2 keeps r1 live
    lost = cluster.commit(cluster.replicas.primary, Lost(P, epoch, "l2", "m2", "gone"), "d1", 41.0)
    assert isinstance(lost, CommittedFact)
    assert cluster.hosts.get("a") is None and cluster.hosts.get("b") is None
    assert cluster.resync_plan([P]).hosts == ()
    refused = cluster.admit_worker(cluster.replicas.primary, "a", "token", 1.0)
    assert isinstance(refused, Rejection) and refused.reason == "token_invalid", refused


def test_refcontroller_history_pages_the_audit_log(tmp_path: Path, capsys: object) -> None:
    import json

    from refcontroller.cli import main

    (tmp_path / "data").mkdir()
    store = FactStore.open(tmp_path / "data" / "facts.sqlite")
    store.append_many([intent("r1", "a"), instance("r1", "a", "m1"), Lost(P, E, "l1", "m1", "x")], "d")
    store.close()
    assert main(["history", "--data", str(tmp_path / "data"), "--provider", P, "--limit", "2"]) == 0
    out = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert [(f["index"], f["ended_at"]) for f in out["facts"]] == [(1, 3), (2, 3)] and out["next_after"] == 2
    assert main(["history", "--data", str(tmp_path / "data"), "--provider", P, "--after", "2"]) == 0
    out = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert out["facts"][0]["fact"]["kind"] == "Lost" and out["next_after"] is None
    assert main(["history", "--data", str(tmp_path / "nothing"), "--provider", P]) == 2


def test_an_incremental_resync_sends_every_later_fact_and_only_to_the_same_incarnation(cluster: Cluster) -> None:
    granted = cluster.acquire(cluster.replicas.primary, P, "d1", 40.0)
    assert isinstance(granted, Granted), granted
    epoch = granted.lease.epoch
    for fact in (intent("r1", "a"), instance("r1", "a", "m1"), intent("r2", "b")):
        assert isinstance(
            cluster.commit(cluster.replicas.primary, attrs.evolve(fact, epoch=epoch), "d1", 41.0), CommittedFact
        )
    full = cluster.resync_plan([P])
    assert not full.incremental and full.as_of == 3
    lost = cluster.commit(cluster.replicas.primary, Lost(P, epoch, "l1", "m1", "gone"), "d1", 41.0)
    assert isinstance(lost, CommittedFact)
    later = cluster.resync_plan([P], after_index=3, incarnation=cluster.store.incarnation)
    assert later.incremental and later.as_of == 4
    assert [c.index for page in range(len(later.fact_ranges)) for c in cluster.resync_facts(later, page)] == [4]
    # another incarnation, or an index past the log: the whole resync set (r1 ended with m1: only r2 and the Lost)
    for after, incarnation in ((3, "other"), (99, cluster.store.incarnation), (0, cluster.store.incarnation)):
        plan = cluster.resync_plan([P], after_index=after, incarnation=incarnation)
        assert not plan.incremental
        assert [c.index for page in range(len(plan.fact_ranges)) for c in cluster.resync_facts(plan, page)] == [3, 4]
    # folding the full set, or the earlier full one plus the increment, gives the daemon the same live state
    whole = fold(c for page in range(len(full.fact_ranges)) for c in cluster.resync_facts(full, page))
    whole.mark_synced(full.as_of)
    whole.apply_after_sync([c for page in range(len(later.fact_ranges)) for c in cluster.resync_facts(later, page)], 4)
    fresh = fold(cluster.store.facts([P], 1, 4))
    assert _summary(whole) == _summary(fresh) and whole.synced_to == 4


def _records(view: FactView) -> dict[str, object]:
    """Every record the view holds, live or not (``_summary`` is the live part only)."""
    return {
        "machines": {m: (r.state, r.op_id) for m, r in view.machines.items()},
        "intents": set(view.intents),
        "returns": {op: r.done for op, r in view.returns.items()},
        "orphans": set(view.reported_orphans),
        "open_ops": list(view.open_ops),
        "open_returns": set(view.open_returns),
    }


@pytest.mark.sweep
def test_the_daemons_view_drops_ended_lifecycles_as_the_resync_set_does() -> None:
    """The daemon's view (``prune``) folded fact by fact, or from a full resync plus incremental ones, holds what a
    fresh full resync gives: every record, not only the live part, so it never grows with history (issue 18)."""
    for seed in range(60):
        rng = random.Random(1000 + seed)
        store = FactStore.open(":memory:")
        facts = _random_facts(rng, rng.randint(20, 200))
        daemon = FactView(prune=True)  # every fact as it is committed (the daemon's own commits)
        synced: FactView | None = None  # a full resync early, then an incremental one at each checkpoint
        for i, fact in enumerate(facts):
            committed = store.append(fact, "d")
            daemon.apply(committed)
            if i == 3:
                synced = fold(resync_set(store), FactView(prune=True))
                synced.mark_synced(store.last_index())
            if synced is not None and (i % 13 == 0 or i == len(facts) - 1):
                synced.apply_after_sync(store.facts([P], synced.synced_to + 1, store.last_index()), store.last_index())
            if i % 13 == 0 or i == len(facts) - 1:
                fresh = fold(resync_set(store), FactView(prune=True))
                assert _records(daemon) == _records(fresh), f"seed {seed} after fact {i + 1}"
                assert _summary(daemon) == _summary(fold(store.facts([P], 1, store.last_index())))
                if synced is not None:
                    assert _records(synced) == _records(fresh), f"seed {seed} after fact {i + 1} (incremental)"


def test_an_incremental_resync_leaves_no_returned_or_lost_machine_in_the_daemons_view() -> None:
    from provisionerd.controller.view import ResyncCollector

    store = FactStore.open(":memory:")
    for fact in (intent("r1", "a"), instance("r1", "a", "m1"), intent("r2", "b", "c")):
        store.append(fact, "d")
    store.append(instance("r2", "b", "m2"), "d")
    store.append(instance("r2", "c", "m3"), "d")
    hosts = (HostState("a", P, "m1", HostStatus.IDLE, 1.0), HostState("b", P, "m2", HostStatus.IDLE, 1.0))
    full = ResyncCollector()
    assert full.add(0, 1, tuple(resync_set(store)), hosts, (False, store.last_index(), 1))
    view = full.build(1, "ctl0", 1)
    assert set(view.facts.machines) == {"m1", "m2", "m3"} and set(view.hosts) == {"a", "b"}
    before = store.last_index()
    for fact in (ReturnIntent(P, E, "x1", ("m1",), "idle"), Returned(P, E, "x1", ("m1",)), Lost(P, E, "l1", "m2", "x")):
        store.append(fact, "d")
    later = ResyncCollector()
    assert later.add(
        0, 1, tuple(store.facts([P], before + 1, store.last_index())), hosts, (True, store.last_index(), 2)
    )
    view = later.build_incremental(view.facts, 1, "ctl0", 1)
    # r1 ended with m1 (returned): its intent, machine, return and host are gone; r2 lives on in m3, so the lost m2
    # stays as the resync set keeps it until r2 ends
    assert set(view.facts.machines) == {"m2", "m3"} and set(view.facts.intents) == {"r2"}
    assert view.facts.returns == {} and view.facts.open_returns == {} and set(view.hosts) == {"b"}
    store.append(Lost(P, E, "l2", "m3", "x"), "d")
    view.apply_fact(CommittedFact(store.last_index(), Lost(P, E, "l2", "m3", "x")))
    assert view.facts.machines == {} and view.facts.intents == {} and dict(view.hosts) == {}
    assert view.facts.active_by_demand == {} and view.facts.live_by_offer == {}
    fresh = fold(resync_set(store), FactView(prune=True))
    assert _records(view.facts) == _records(fresh)
