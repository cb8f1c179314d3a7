"""The reference controller's side of the drain (issue 20, item 4): a committed ``DrainRequested`` marks the hosts
of its machines draining, pushes the change, and no new work is placed on them, across a restart too."""

from __future__ import annotations

from pathlib import Path

from rc_factories import instance, intent
from test_cluster import GRACE_END, commit, grant

from provisionerd.domain.model import CommittedFact, DrainRequested, HostStatus, Returned
from refcontroller.cluster import Cluster
from refcontroller.credentials import new_credential
from refcontroller.store import FactStore


def two_joined(cluster: Cluster):
    epoch = grant(cluster, "aws", "d1", GRACE_END)
    commit(cluster, intent("aws", epoch, refs=("i-1", "i-2")), "d1", 36.0)
    for ref in ("i-1", "i-2"):
        commit(cluster, instance("aws", epoch, ref), "d1", 37.0)
    credential = new_credential()
    cluster.admit_worker(0, "i-1", "tok-i-1", wall=10.0, credential=credential)
    cluster.admit_worker(0, "i-2", "tok-i-2", wall=10.0)
    cluster.worker_status("i-1", HostStatus.BUSY, 11.0)
    return epoch, credential


def test_a_drain_marks_the_host_draining_pushes_it_and_takes_it_out_of_placement(cluster: Cluster) -> None:
    pushed: list = []
    epoch, _ = two_joined(cluster)
    assert [h.instance_ref for h in cluster.hosts.placeable()] == ["i-2"]  # i-1 is busy
    cluster.worker_status("i-1", HostStatus.IDLE, 12.0)
    assert [h.instance_ref for h in cluster.hosts.placeable()] == ["i-1", "i-2"]
    cluster.worker_status("i-1", HostStatus.BUSY, 13.0)
    drain = DrainRequested("aws", epoch, "op-d", ("m-i-1",), "max_ttl", 14.0)
    assert isinstance(commit(cluster, drain, "d1", 38.0), CommittedFact)
    host = cluster.hosts.get("i-1")
    assert host.draining and host.status is HostStatus.BUSY
    pushed.extend(cluster.take_host_changes())  # what the session would push
    assert pushed == [host]
    # It finishes its work and reports idle: still no new work for it.
    assert cluster.worker_status("i-1", HostStatus.IDLE, 15.0).draining
    assert [h.instance_ref for h in cluster.hosts.placeable()] == ["i-2"]
    assert cluster.status(40.0)["placeable"] == ["i-2"]
    assert [h["draining"] for h in cluster.status(40.0)["hosts"]] == [True, False]
    # The same fact again (a retried commit) is the same fact: nothing changes, nothing is pushed.
    assert isinstance(commit(cluster, drain, "d1", 39.0), CommittedFact)
    pushed.extend(cluster.take_host_changes())  # what the session would push
    assert pushed == [host]


def test_a_drain_survives_a_controller_restart_and_ends_with_the_machine(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    store = FactStore.open(path)
    cluster = Cluster.open(store, replica_count=1, ttl=30.0, check_interval=5.0, now=0.0)
    epoch, credential = two_joined(cluster)
    commit(cluster, DrainRequested("aws", epoch, "op-d", ("m-i-1",), "max_ttl", 14.0), "d1", 38.0)
    store.close()

    store = FactStore.open(path)
    again = Cluster.open(store, replica_count=1, ttl=30.0, check_interval=5.0, now=1000.0)
    host = again.admit_worker(0, "i-1", credential, wall=20.0)
    assert host.draining and again.hosts.get("i-1").draining  # rejoined: still draining
    assert [h.instance_ref for h in again.hosts.placeable()] == []
    assert store.live_count() == 4  # the intent, two instance facts and the drain
    # The drain is state while its machine lives, and history with its lifecycle.
    epoch = grant(again, "aws", "d1", 1000.0)
    commit(again, Returned("aws", epoch, "op-r", ("m-i-1", "m-i-2")), "d1", 1001.0)
    assert store.live_count() == 0
