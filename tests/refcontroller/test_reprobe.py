"""Health after join, the reference controller's side (issue 35 item 2; protocol §6.4 "Health after join"): a
worker's re-probe (``WorkerStatus.capabilities`` with ``probedAt``) replaces its host's report, stamped
``probedAt``, and is pushed to the provisioner like any host change; it is bounded like the join's report (bad
entries dropped, logged and counted), a report without its time is rejected, and a rejoin's own report puts
``probedAt`` back to 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from rc_client import Peer, memory_controller, on_mock_clock
from test_drain import two_joined
from test_worker_rejoin_server import machines

from provisionerd.domain.model import HostStatus, Role
from provisionerd.wire.messages import Ack, HostStatePush, JoinReply, Rejected, WorkerStatus
from refcontroller.cluster import Cluster
from refcontroller.replies import worker_status_valid

JOINED = {"ncpus": "4", "ngpus": "1"}
BROKEN = {"ncpus": "4", "ngpus": "!exit 9"}


async def host_push(prov: Peer) -> HostStatePush:
    """The next host push (demand pages that come between are skipped)."""
    while not isinstance(push := await prov.push(), HostStatePush):
        pass
    return push


def test_a_reprobe_replaces_the_report_once_and_a_join_report_resets_its_time(cluster: Cluster) -> None:
    two_joined(cluster)
    assert cluster.hosts.report("i-1", JOINED) is not None
    host = cluster.worker_probed("i-1", BROKEN, 1000.0)
    assert host is not None and (dict(host.capabilities), host.probed_at) == (BROKEN, 1000.0)
    assert host.status is HostStatus.BUSY  # nothing else moves
    assert cluster.worker_probed("i-1", BROKEN, 1000.0) is None  # unchanged: nothing to push
    later = cluster.worker_probed("i-1", JOINED, 1300.0)  # fixed again: still a re-probe's report
    assert later is not None and (dict(later.capabilities), later.probed_at) == (JOINED, 1300.0)
    rejoined = cluster.hosts.report("i-1", JOINED)  # the join's own report
    assert rejoined is not None and rejoined.probed_at == 0.0
    assert cluster.worker_probed("i-9", BROKEN, 1000.0) is None  # unknown host
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="re-probe"):
            cluster.worker_probed("i-1", BROKEN, bad)


def test_a_reprobe_needs_its_time_and_times_are_finite() -> None:
    assert worker_status_valid(HostStatus.IDLE, 0.0, 0.0, 1000.0, probed=True)
    assert worker_status_valid(HostStatus.IDLE)  # older workers: no re-probe
    assert not worker_status_valid(HostStatus.IDLE, 0.0, 0.0, 0.0, probed=True)
    for bad in (float("nan"), float("inf"), -1.0):
        assert not worker_status_valid(HostStatus.IDLE, 0.0, 0.0, bad, probed=True)


@on_mock_clock
async def test_a_reprobe_is_pushed_to_the_provisioner_bounded_and_a_bad_one_is_rejected(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        prov = await machines(h)
        worker, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1", capabilities=JOINED)
        assert isinstance(reply, JoinReply) and reply.accepted
        joined = await host_push(prov)
        assert (dict(joined.hosts[0].capabilities), joined.hosts[0].probed_at) == (JOINED, 0.0)

        # Busy and a re-probe in one WorkerStatus: one push carries both.
        report = {**BROKEN, "bad key": "1", "long": "x" * 65}
        status = WorkerStatus(HostStatus.BUSY, capabilities=report, probed_at=1000.0)
        assert await worker.request(status) == Ack()
        push = await host_push(prov)
        assert push.seq == joined.seq + 1
        [host] = push.hosts
        assert (host.status, dict(host.capabilities), host.probed_at) == (HostStatus.BUSY, BROKEN, 1000.0)
        assert h.server.stats["capabilities_dropped"] == 2
        assert h.cluster.hosts.get("i-1") == host

        # A report without its time: rejected, nothing recorded, the link stays up.
        bad = await worker.request(WorkerStatus(HostStatus.BUSY, capabilities=JOINED))
        assert isinstance(bad, Rejected) and bad.reason == "invalid"
        # A status without a report (empty = unchanged) leaves the re-probe as it is: nothing to push.
        assert await worker.request(WorkerStatus(HostStatus.BUSY, probed_at=2000.0)) == Ack()
        current = h.cluster.hosts.get("i-1")
        assert current is not None and (dict(current.capabilities), current.probed_at) == (BROKEN, 1000.0)
        assert not [p for p in prov.pushes if isinstance(p, HostStatePush)]
