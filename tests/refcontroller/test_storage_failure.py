"""A full disk at the reference controller, as SQLite really reports it: ``PRAGMA max_page_count`` set through the
test-only limit file (``REFCONTROLLER_TEST_PAGE_LIMIT_FILE``) makes a write that needs one more page fail with
``database or disk is full``. The store rolls back and raises ``StoreFailure``; the cluster answers
``storage_failure`` and nothing in memory advances; once the limit is lifted the same writes succeed."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisionerd.domain.model import CommittedFact, Epoch
from refcontroller.cluster import Cluster
from refcontroller.commits import STORAGE_FAILURE, Rejection
from refcontroller.leases import Granted
from refcontroller.store import PAGE_LIMIT_ENV, FactStore, StoreFailure
from tests.refcontroller.rc_factories import instance, intent, item

TTL, CHECK = 30.0, 5.0


@pytest.fixture
def limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "page-limit"
    monkeypatch.setenv(PAGE_LIMIT_ENV, str(path))
    return path


def fill(cluster: Cluster, epoch: Epoch, holder: str, start: int) -> tuple[int, Rejection]:
    """Commit intents until one is refused; the number committed and the refusal (bounded: 10000 tries)."""
    for n in range(start, start + 10000):
        refs = tuple(f"i-{n}-{k}" for k in range(8))
        result = cluster.commit(0, intent("aws", epoch, op_id=f"op-{n}", refs=refs), holder, 50.0)
        if isinstance(result, Rejection):
            return n - start, result
    raise AssertionError("the page limit never bit")


def test_a_full_disk_is_answered_storage_failure_and_the_store_stays_as_it_was(tmp_path: Path, limit: Path) -> None:
    store = FactStore.open(tmp_path / "facts.sqlite")
    cluster = Cluster.open(store, replica_count=1, ttl=TTL, check_interval=CHECK, now=0.0)
    granted = cluster.acquire(0, "aws", "d1", 40.0)
    assert isinstance(granted, Granted)
    epoch = granted.lease.epoch
    limit.write_text("1")  # no page more than the file has now
    committed, refusal = fill(cluster, epoch, "d1", 0)
    assert refusal.reason == STORAGE_FAILURE and "full" in refusal.detail
    assert cluster.storage_failures == 1 and cluster.status(50.0)["storage_failures"] == 1
    count, last, mark = store.count(), store.last_index(), store._current_mark()
    # Refused again and again: nothing is written, nothing half-written, the mark does not move.
    for n in range(3):
        again = cluster.commit(
            0, intent("aws", epoch, op_id=f"again-{n}", refs=tuple(f"x-{n}-{k}" for k in range(16))), "d1", 50.0
        )
        assert isinstance(again, Rejection) and again.reason == STORAGE_FAILURE
    assert (store.count(), store.last_index(), store._current_mark()) == (count, last, mark)
    assert cluster.storage_failures == 4
    # A demand change is refused with its reason (the admin reply says it) and the demand stays.
    before = cluster.demand
    with pytest.raises(ValueError, match="not made durable"):
        cluster.set_demand([item(f"demand-{n}", 7) for n in range(400)])
    assert cluster.demand == before
    # Freed: the same kind of commit goes through, with the next index.
    limit.unlink()
    done = cluster.commit(0, intent("aws", epoch, op_id="after", refs=("y-1",)), "d1", 51.0)
    assert isinstance(done, CommittedFact) and done.index == last + 1
    store.close()
    reopened = FactStore.open(tmp_path / "facts.sqlite")  # the mark agrees with the file: no refusal
    assert reopened.count() == count + 1
    reopened.close()


def test_a_grant_whose_grantee_cannot_be_recorded_is_not_granted(tmp_path: Path, limit: Path) -> None:
    store = FactStore.open(tmp_path / "facts.sqlite")
    cluster = Cluster.open(store, replica_count=1, ttl=TTL, check_interval=CHECK, now=0.0)
    first = cluster.acquire(0, "aws", "d1", 40.0)
    assert isinstance(first, Granted)
    limit.write_text("1")
    # Each new provider's first grant records a grantee row in the meta table, until its page is full.
    for n in range(200):
        provider = f"p{n}-" + "x" * 200
        refused = cluster.acquire(0, provider, "d1", 41.0)
        if isinstance(refused, Rejection):
            break
    else:
        raise AssertionError("no grantee write was refused")
    assert refused.reason == STORAGE_FAILURE
    assert cluster.leases.live(provider, 41.0) is None  # no lease nobody was told of
    assert store.last_grantee(provider) is None
    seq = cluster.leases.seq
    limit.unlink()
    again = cluster.acquire(0, provider, "d1", 42.0)
    assert isinstance(again, Granted) and again.lease.epoch.seq == seq + 1  # the withdrawn epoch is never given
    assert store.last_grantee(provider) == "d1"


def test_an_instance_fact_refused_for_storage_identifies_no_host(tmp_path: Path, limit: Path) -> None:
    store = FactStore.open(tmp_path / "facts.sqlite")
    cluster = Cluster.open(store, replica_count=1, ttl=TTL, check_interval=CHECK, now=0.0)
    granted = cluster.acquire(0, "aws", "d1", 40.0)
    assert isinstance(granted, Granted)
    epoch = granted.lease.epoch
    assert isinstance(cluster.commit(0, intent("aws", epoch, refs=("i-1",)), "d1", 40.0), CommittedFact)
    assert not isinstance(cluster.admit_worker(0, "i-1", "tok-i-1", 1000.0), Rejection)
    seen: list[object] = []
    limit.write_text("1")
    fill(cluster, epoch, "d1", 0)
    for n in range(10000):  # instance facts of the same size as the one for i-1, until one is refused
        if isinstance(cluster.commit(0, instance("aws", epoch, f"z-{n:04}"), "d1", 41.0), Rejection):
            break
    result = cluster.commit(0, instance("aws", epoch, "i-1"), "d1", 41.0)
    assert isinstance(result, Rejection) and result.reason == STORAGE_FAILURE
    seen.extend(cluster.take_host_changes())  # what the session would push
    assert seen == [] and not any(c.fact == instance("aws", epoch, "i-1") for c in store.all_facts())
    host = cluster.hosts.get("i-1")
    assert host is not None and not host.machine_id
    limit.unlink()
    assert isinstance(cluster.commit(0, instance("aws", epoch, "i-1"), "d1", 42.0), CommittedFact)
    seen.extend(cluster.take_host_changes())  # what the session would push
    assert len(seen) == 1  # the same commit, freed, identifies the host: the check above can fail


def test_store_failure_is_raised_only_after_the_rollback(tmp_path: Path, limit: Path) -> None:
    store = FactStore.open(tmp_path / "facts.sqlite")
    store.save_term(1)
    limit.write_text("1")
    with pytest.raises(StoreFailure, match="full"):
        for n in range(10000):
            store.append(intent("aws", Epoch(1, 1), op_id=f"op-{n}", refs=tuple(f"r{n}-{k}" for k in range(8))), "d")
    assert not store._conn.in_transaction
    assert store._current_mark().changes == int(
        store._conn.execute("SELECT value FROM meta WHERE key='changes'").fetchone()[0]
    )
