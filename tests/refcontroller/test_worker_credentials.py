"""A worker's credential after its first join is its own: issued for the spent token, revocable, durable."""

from __future__ import annotations

from pathlib import Path

import pytest
from rc_factories import instance, intent, sha

from provisionerd.agent.token import rejoin_credential, rejoin_hash
from provisionerd.domain.model import CommittedFact, Epoch, HostState, HostStatus, Lost, Returned
from refcontroller.cluster import Cluster
from refcontroller.commits import Rejection
from refcontroller.credentials import CREDENTIAL_PREFIX, credential_hash, new_credential
from refcontroller.leases import Granted
from refcontroller.store import FactStore

GRACE_END = 35.0


def open_cluster(path: Path | str, now: float = 0.0) -> Cluster:
    return Cluster.open(FactStore.open(path), replica_count=3, ttl=30.0, check_interval=5.0, now=now)


def lease(cluster: Cluster, now: float) -> Epoch:
    granted = cluster.acquire(cluster.replicas.primary, "aws", "d1", now)
    assert isinstance(granted, Granted), granted
    return granted.lease.epoch


def commit(cluster: Cluster, fact: object, now: float) -> None:
    assert isinstance(cluster.commit(cluster.replicas.primary, fact, "d1", now), CommittedFact)  # type: ignore[arg-type]


def join(cluster: Cluster, ref: str, secret: str, *, credential: str | None = None, live: bool = False) -> object:
    return cluster.admit_worker(cluster.replicas.primary, ref, secret, 1e9, credential=credential, live=live)


def refused(result: object, reason: str) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason == reason, result
    return result


def two_machines(cluster: Cluster) -> Epoch:
    epoch = lease(cluster, GRACE_END)
    commit(cluster, intent("aws", epoch, refs=("i-1", "i-2")), 36.0)
    commit(cluster, instance("aws", epoch, "i-1"), 37.0)
    commit(cluster, instance("aws", epoch, "i-2"), 37.0)
    return epoch


def test_the_token_is_exchanged_for_a_credential_that_alone_admits_afterwards(cluster: Cluster) -> None:
    two_machines(cluster)
    mine = new_credential()
    assert mine.startswith(CREDENTIAL_PREFIX) and len(mine) == len(CREDENTIAL_PREFIX) + 43
    host = join(cluster, "i-1", "tok-i-1", credential=mine)
    assert isinstance(host, HostState) and host.machine_id == "m-i-1"
    record = cluster.store.credential("i-1")
    assert record is not None and record.credential_hash == credential_hash(mine) and record.revoked == ""
    assert record.delivered_at == 0 and cluster.credential_delivered("i-1", 1e9)  # the worker's next frame
    record = cluster.store.credential("i-1")
    assert record is not None and record.delivered_at == 1e9
    # The spent token, its rejoin proof and another credential are refused; the credential admits, live or not.
    refused(join(cluster, "i-1", "tok-i-1"), "token_invalid")
    refused(join(cluster, "i-1", rejoin_credential("tok-i-1", "i-1")), "token_invalid")
    refused(join(cluster, "i-1", new_credential(), live=True), "credential_stale")
    refused(join(cluster, "i-2", mine), "credential_stale")  # bound to its instance
    again = join(cluster, "i-1", mine, live=True)
    assert isinstance(again, HostState) and again.machine_id == "m-i-1"
    assert cluster.store.credential("i-1") == record  # presenting it does not change it


def test_a_lost_host_s_credential_is_refused_and_stays_refused_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    cluster = open_cluster(path)
    two_machines(cluster)
    mine, other = new_credential(), new_credential()
    assert isinstance(join(cluster, "i-1", "tok-i-1", credential=mine), HostState)
    assert isinstance(join(cluster, "i-2", "tok-i-2", credential=other), HostState)
    assert cluster.worker_lost("i-1", 2e9).status is HostStatus.LOST
    refused(join(cluster, "i-1", mine), "token_invalid")  # lost in memory
    cluster.store.close()

    restarted = open_cluster(path, now=1000.0)
    assert restarted.hosts.get("i-1") is None  # the host table is memory only
    refused(join(restarted, "i-1", mine), "credential_revoked")  # the store remembers
    assert isinstance(join(restarted, "i-2", other), HostState)  # the other instance rejoins with its own
    assert restarted.store.credential_counts() == {"live": 1, "lost": 1}
    restarted.store.close()


def test_a_returned_machine_s_credential_is_refused_also_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    cluster = open_cluster(path)
    epoch = two_machines(cluster)
    mine = new_credential()
    assert isinstance(join(cluster, "i-1", "tok-i-1", credential=mine), HostState)
    assert isinstance(join(cluster, "i-1", mine), HostState)
    commit(cluster, Returned("aws", epoch, "ret-1", ("m-i-1",)), 40.0)  # i-2 keeps op-1 live: not "ended"
    assert not cluster.store.instance_ended("i-1") and cluster.store.instance_gone("i-1")
    refused(join(cluster, "i-1", mine), "credential_revoked")
    cluster.store.close()
    restarted = open_cluster(path, now=1000.0)
    refused(join(restarted, "i-1", mine), "credential_revoked")
    refused(join(restarted, "i-1", "tok-i-1"), "credential_revoked")
    restarted.store.close()


def test_a_lost_fact_revokes_an_unused_token_too(cluster: Cluster) -> None:
    epoch = two_machines(cluster)
    commit(cluster, Lost("aws", epoch, "l-1", "m-i-2", "reclaimed"), 40.0)
    refused(join(cluster, "i-2", "tok-i-2"), "credential_revoked")
    assert cluster.store.credential("i-2") is None


def test_a_rejoin_proof_of_an_older_controller_is_exchanged_once_and_never_while_a_session_is_live(
    cluster: Cluster,
) -> None:
    two_machines(cluster)
    # i-1 was admitted by a controller before credentials: it stored the proof's hash, no credential.
    assert cluster.store.use_token(sha("tok-i-1"), "i-1", 1.0, rejoin_hash("tok-i-1", "i-1"))
    proof = rejoin_credential("tok-i-1", "i-1")
    refused(join(cluster, "i-1", proof, live=True), "token_invalid")  # a proof never drops a live session
    mine = new_credential()
    assert isinstance(join(cluster, "i-1", proof, credential=mine), HostState)
    refused(join(cluster, "i-1", proof), "token_invalid")  # once
    assert isinstance(join(cluster, "i-1", mine), HostState)


def test_the_store_holds_no_token_and_no_credential(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    cluster = open_cluster(path)
    two_machines(cluster)
    mine = new_credential()
    assert isinstance(join(cluster, "i-1", "tok-i-1", credential=mine), HostState)
    cluster.worker_lost("i-1", 2e9)
    cluster.store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert credential_hash(mine).encode() in stored  # the hash is there (the test can see the files)
    assert mine.encode() not in stored and mine[len(CREDENTIAL_PREFIX) :].encode() not in stored
    assert b"tok-i-1" not in stored


@pytest.mark.parametrize("secret", ["", "x" * 1025, CREDENTIAL_PREFIX, CREDENTIAL_PREFIX + "A" * 43])
def test_malformed_or_unknown_credentials_are_refused_without_echoing_them(cluster: Cluster, secret: str) -> None:
    two_machines(cluster)
    result = join(cluster, "i-1", secret)
    assert isinstance(result, Rejection) and result.reason in ("token_invalid", "credential_stale"), result
    assert not secret or secret not in result.detail


def test_a_store_written_before_delivered_at_counts_its_credentials_as_delivered(tmp_path: Path) -> None:
    """The column is added on open; every credential already there counts as delivered (the safe side: no spent
    token buys one of them again)."""
    import sqlite3

    path = tmp_path / "facts.sqlite"
    conn = sqlite3.connect(str(path))
    conn.executescript(
        "CREATE TABLE worker_credentials (instance_ref TEXT PRIMARY KEY, credential_hash TEXT NOT NULL,"
        " issued_at REAL NOT NULL, revoked TEXT NOT NULL DEFAULT '', revoked_at REAL NOT NULL DEFAULT 0);"
        "INSERT INTO worker_credentials (instance_ref, credential_hash, issued_at) VALUES ('i-old', 'h', 7.0);"
    )
    conn.commit()
    conn.close()
    store = FactStore.open(path)
    record = store.credential("i-old")
    assert record is not None and record.delivered_at == 7.0
    assert not store.reissue_credential("any", "i-old", "h2", 8.0)
    store.close()
