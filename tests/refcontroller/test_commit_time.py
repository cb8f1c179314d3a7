"""Facts carry the controller's commit time (issue 32 item 7): ``CommittedFact.committed_at``, wall-clock epoch
seconds, stamped when the controller commits a fact and kept as durably as the fact (``fact_times`` in the SQLite
store, the ``append`` entry of the etcd log). Every read of the log carries it (resync, history, ``find`` for a
retried commit, ``all_facts``); a fact committed before the field existed reads 0, "not known"."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import trio
from rc_client import granted, joined_provisioner, memory_controller, on_mock_clock
from rc_factories import FakeElection, FakeEtcd, instance, intent

from provisionerd.domain.model import CommittedFact, Epoch, Lost
from provisionerd.wire.messages import FactAck, FactCommit, HistoryPage, HistoryQuery, ResyncPage, ResyncRequest
from refcontroller.cluster import Cluster
from refcontroller.history import history_page
from refcontroller.store import FactStore, read_history
from refcontroller.store_etcd import EtcdFactStore

P = "aws"
T = 1_765_000_000.0  # a wall-clock time (2025-12-06)
GRACE_END = 35.0  # promoted at 0, ttl 30, check 5 (conftest)


def committed(result: object) -> CommittedFact:
    assert isinstance(result, CommittedFact), result
    return result


def everything_read(store: FactStore, cluster: Cluster | None = None) -> dict[str, list[tuple[int, float]]]:
    """``(index, committed_at)`` of the log as each read path gives it."""
    out = {
        "all_facts": [(c.index, c.committed_at) for c in store.all_facts()],
        "facts": [(c.index, c.committed_at) for c in store.facts([P], 1, 100)],
        "facts_as_of": [(c.index, c.committed_at) for c in store.facts([P], 1, 100, as_of=store.last_index())],
        "history": [(row.index, row.committed_at) for row in store.history(P)],
        "history_rows": [(i, at) for i, _, at in store.history_rows(None, 0, 100, 100)],
        "history_page": [
            (c.index, c.committed_at) for c in history_page(store, HistoryQuery(), None, max_items=100).facts
        ],
    }
    if cluster is not None:
        plan = cluster.resync_plan([P])
        out["resync"] = [
            (c.index, c.committed_at) for page in range(len(plan.fact_ranges)) for c in cluster.resync_facts(plan, page)
        ]
    return out


def test_the_commit_time_is_stored_with_the_fact_and_survives_a_restart_of_the_controller(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    store = FactStore.open(path)
    cluster = Cluster.open(store, replica_count=1, ttl=30.0, check_interval=5.0, now=0.0)
    granted_ = cluster.acquire(0, P, "d1", GRACE_END)
    epoch = granted_.lease.epoch  # type: ignore[union-attr]
    first = committed(cluster.commit(0, intent(P, epoch, "op-1", ("i-1",)), "d1", 40.0, T + 0.25))
    second = committed(cluster.commit(0, instance(P, epoch, "i-1"), "d1", 41.0, T + 1.5))
    assert (first.committed_at, second.committed_at) == (T + 0.25, T + 1.5)
    # A retried commit (its ack lost) answers the first commit's copy: its index and its time, not the retry's.
    again = committed(cluster.commit(0, intent(P, epoch, "op-1", ("i-1",)), "d1", 50.0, T + 99.0))
    assert again == first
    # about a machine no fact made: nothing ends, so the resync set holds all three
    lost = committed(cluster.commit(0, Lost(P, epoch, "op-2", "m-other", "gone"), "d1", 42.0, T + 2.0))
    expected = [(1, T + 0.25), (2, T + 1.5), (3, T + 2.0)]
    before = everything_read(store, cluster)
    assert all(rows == expected for rows in before.values()), before
    store.close()

    reopened = FactStore.open(path)  # a restart of the controller: a new Cluster on the same file
    cluster = Cluster.open(reopened, replica_count=1, ttl=30.0, check_interval=5.0, now=0.0)
    assert everything_read(reopened, cluster) == before
    assert reopened.find(lost.fact) == lost
    assert [(row.index, row.committed_at) for row in read_history(path, P)] == expected  # read-only, beside it
    reopened.close()


def test_a_store_from_before_commit_times_opens_and_reads_0_for_its_facts(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    store = FactStore.open(path)
    epoch = Epoch(1, 1)
    store.append(intent(P, epoch, "op-1", ("i-1",)), "d1", T)
    store.append(instance(P, epoch, "i-1"), "d1", T + 1)
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TABLE fact_times")  # what a controller from before commit times wrote (its triggers go too)
    conn.close()

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert [(row.index, row.committed_at) for row in read_history(path, P)] == [(1, 0.0), (2, 0.0)]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # the read-only reader wrote nothing

    old = FactStore.open(path)  # opens (no refusal), gains the table, empty: the old facts' times are not known
    assert [(c.index, c.committed_at) for c in old.all_facts()] == [(1, 0.0), (2, 0.0)]
    assert old.find(instance(P, epoch, "i-1")) == CommittedFact(2, instance(P, epoch, "i-1"), 0.0)
    new = old.append(Lost(P, epoch, "op-2", "m-i-1", "gone"), "d1", T + 2)
    assert new.committed_at == T + 2
    old.close()
    again = FactStore.open(path)  # the new table is checked at open like every other (its rows carry their sum)
    assert [(c.index, c.committed_at) for c in again.all_facts()] == [(1, 0.0), (2, 0.0), (3, T + 2)]
    again.close()


def test_a_fact_committed_without_a_wall_clock_has_no_time_row_and_reads_0(store: FactStore) -> None:
    epoch = Epoch(1, 1)
    for at in (0.0, float("nan"), float("inf"), -5.0):
        fact = store.append(intent(P, epoch, f"op-{at}", (f"i-{at}",)), "d1", at)
        assert fact.committed_at == 0.0
    assert [c.committed_at for c in store.all_facts()] == [0.0] * 4
    assert store._conn.execute("SELECT count(*) FROM fact_times").fetchone()[0] == 0


# --- the etcd store: the time is in the log entry, so every replica replays it -------------------------------------


def etcd_store(etcd: FakeEtcd) -> EtcdFactStore:
    return EtcdFactStore.replay(etcd, FakeElection())  # type: ignore[arg-type]


def test_the_etcd_log_entry_carries_the_commit_time_and_every_replay_gives_it() -> None:
    etcd = FakeEtcd()
    primary = etcd_store(etcd)
    epoch = Epoch(1, 1)
    assert primary.append(intent(P, epoch, "op-1", ("i-1",)), "d1", T + 0.5).committed_at == T + 0.5
    assert primary.append(instance(P, epoch, "i-1"), "d1", T + 1.25).committed_at == T + 1.25
    (key,) = [k for k in sorted(etcd.kv) if k.endswith(b"ops/00000000000000000002")]
    entry = json.loads(etcd.kv[key])
    assert entry["op"] == "append" and entry["args"][1:] == ["d1", T + 1.25]
    written = everything_read(primary)
    primary.close()
    replica = etcd_store(etcd)  # another replica replays the same log: the same times
    assert everything_read(replica) == written
    assert [(c.index, c.committed_at) for c in replica.all_facts()] == [(1, T + 0.5), (2, T + 1.25)]
    replica.close()


def test_an_etcd_entry_from_before_commit_times_replays_as_0() -> None:
    from refcontroller.store_etcd import _entry_sum, _op_key

    etcd = FakeEtcd()
    primary = etcd_store(etcd)
    epoch = Epoch(1, 1)
    primary.append(intent(P, epoch, "op-1", ("i-1",)), "d1", T)
    primary.close()
    # Rewrite entry 1 as a controller from before commit times wrote it: two arguments (and their checksum).
    key = _op_key(b"provisionerd/", 1)
    entry = json.loads(etcd.kv[key])
    args = entry["args"][:2]
    etcd.kv[key] = json.dumps({"op": "append", "args": args, "sum": _entry_sum(1, "append", args)}).encode()
    replica = etcd_store(etcd)
    assert [(c.index, c.committed_at) for c in replica.all_facts()] == [(1, 0.0)]
    assert replica.append(instance(P, epoch, "i-1"), "d1", T + 3).committed_at == T + 3  # later ones have it
    replica.close()
    assert [(c.index, c.committed_at) for c in etcd_store(etcd).all_facts()] == [(1, 0.0), (2, T + 3)]


# --- over the wire: the FactAck, the resync and the history query carry it -----------------------------------------


@on_mock_clock
async def test_the_ack_the_resync_and_the_history_carry_the_controllers_wall_clock_time(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, replicas=1) as h:  # its wall clock is trio's (mock) clock
        peer = await joined_provisioner(h)
        await trio.sleep(GRACE_END)
        epoch = await granted(peer)
        await trio.sleep(2.5)
        ack = await peer.request(FactCommit(intent(P, epoch, "op-1", ("i-1",))))
        assert ack == FactAck(1, GRACE_END + 2.5)
        await trio.sleep(10)
        assert await peer.request(FactCommit(intent(P, epoch, "op-1", ("i-1",)))) == ack  # a retry: the same time
        page = await peer.request(ResyncRequest((P,)))
        assert isinstance(page, ResyncPage) and [(c.index, c.committed_at) for c in page.facts] == [(1, 37.5)]
        history = await peer.request(HistoryQuery((P,)))
        assert isinstance(history, HistoryPage) and [(c.index, c.committed_at) for c in history.facts] == [(1, 37.5)]
