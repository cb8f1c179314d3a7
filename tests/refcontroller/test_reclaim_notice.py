"""The reference controller's side of reclaim notices (issue 34, item 4; protocol §6.4 "Reclaim notices"): a
worker's ``WorkerStatus`` notice lands on its host (the later time wins, a 0 never withdraws it), and no new work
is placed on a noticed host."""

from __future__ import annotations

from test_drain import two_joined

from provisionerd.domain.model import HostStatus
from refcontroller.cluster import Cluster
from refcontroller.replies import worker_status_valid


def test_a_notice_lands_on_the_host_stays_and_takes_it_out_of_placement(cluster: Cluster) -> None:
    two_joined(cluster)
    assert [h.instance_ref for h in cluster.hosts.placeable()] == ["i-2"]  # i-1 is busy
    host = cluster.worker_status("i-2", HostStatus.IDLE, 12.0, reclaim_at=1000.0, rebalance_at=900.0)
    assert host is not None and (host.reclaim_at, host.rebalance_at, host.since) == (
        1000.0,
        900.0,
        12.0,
    )  # joined -> idle
    assert cluster.hosts.placeable() == []
    # The same report again changes nothing (nothing to push); a 0 or an earlier time does not withdraw it.
    assert cluster.worker_status("i-2", HostStatus.IDLE, 13.0, 1000.0, 900.0) is None
    assert cluster.worker_status("i-2", HostStatus.IDLE, 13.0, 0.0, 0.0) is None
    later = cluster.worker_status("i-2", HostStatus.BUSY, 14.0, 0.0, 0.0)
    assert later is not None and (later.status, later.reclaim_at, later.since) == (HostStatus.BUSY, 1000.0, 14.0)


def test_notice_times_must_be_finite_and_not_negative() -> None:
    assert worker_status_valid(HostStatus.IDLE, 1000.0, 0.0)
    for bad in (float("nan"), float("inf"), -1.0):
        assert not worker_status_valid(HostStatus.BUSY, bad, 0.0)
        assert not worker_status_valid(HostStatus.BUSY, 0.0, bad)
