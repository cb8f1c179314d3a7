"""The server on in-memory streams and MockClock: join rules, allowlist, leases and facts, pushes, failover.

Roles are given to the server directly here (no TLS); test_server_tls.py covers certificates on real sockets.
Times asserted are exact virtual times: the controller was promoted at t=0 with ttl 30 s and check interval 5 s,
so its grace ends at t=35.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from rc_client import Peer, granted, memory_controller, on_mock_clock, seq_term
from rc_client import joined_provisioner as provisioner
from rc_factories import instance, intent, item

from provisionerd.domain.model import CommittedFact, Epoch, HostStatus, Role
from provisionerd.wire.framing import HEADER, FramedStream
from provisionerd.wire.messages import (
    Ack,
    AdminFailover,
    AdminQuorum,
    AdminReply,
    AdminSetDemand,
    DemandPage,
    ErrorMsg,
    FactAck,
    FactCommit,
    Heartbeat,
    HostStatePush,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Rejected,
    ResyncPage,
    ResyncRequest,
    WorkerStatus,
)

GRACE_END = 35.0


async def idle(seconds: float, *peers: Peer) -> None:
    """Let ``seconds`` pass while the peers heartbeat every 5 s (as a daemon does)."""
    end = trio.current_time() + seconds
    while (left := end - trio.current_time()) > 0:
        await trio.sleep(min(5.0, left))
        for peer in peers:
            await peer.request(Heartbeat(0))


@on_mock_clock
async def test_join_reply_then_demand_snapshot(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        h.cluster.set_demand([item("a", 3)])
        peer, reply = await h.join(Role.PROVISIONER, providers=("aws",))
        assert reply == JoinReply(
            accepted=True,
            term=1,
            primary=True,
            controller_id="replica-0",
            incarnation=h.cluster.store.incarnation,
            last_index=0,
            drains=True,  # it knows DrainRequested (issue 20 item 4)
            history=True,  # it answers HistoryQuery (issue 18 item 1)
        )
        assert len(reply.incarnation) == 32
        assert await peer.push() == DemandPage(snapshot_seq=1, page=0, page_count=1, items=(item("a", 3),))
        assert seq_term(await peer.request(Heartbeat(7))) == (7, 1)


@on_mock_clock
async def test_standby_redirects_to_the_primary_and_closes(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        peer, reply = await h.join(Role.PROVISIONER, replica=2, providers=("aws",))
        assert isinstance(reply, JoinReply)
        assert (reply.accepted, reply.primary, reply.redirect, reply.term) == (False, False, "replica0.test:7000", 1)
        assert await peer.closed()


@on_mock_clock
async def test_join_refusals(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        peer, reply = await h.join(Role.PROVISIONER, protocol_version=99)
        assert isinstance(reply, ErrorMsg) and reply.code == "version_mismatch"
        assert await peer.closed()
        # The Join's role must be the certificate's (here: the role the stream was opened with).
        peer = Peer(h.open_stream(0, Role.WORKER))
        reply = await peer.request(Join(role=Role.PROVISIONER, identity="sneaky", providers=("aws",)))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        peer = Peer(h.open_stream(0, Role.PROVISIONER))
        reply = await peer.request(Heartbeat(1))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_joined"
        peer, reply = await h.join(Role.PROVISIONER, identity="")
        assert isinstance(reply, JoinReply) and not reply.accepted and "identity" in reply.reason
        assert h.server.stats["internal_errors"] == 0


@on_mock_clock
async def test_wrong_role_opcode_gets_not_allowed_and_disconnect(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        admin, _ = await h.join(Role.ADMIN, "ops")
        reply = await admin.request(FactCommit(intent("aws", Epoch(1, 1))))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        assert await admin.closed()
        prov = await provisioner(h)
        reply = await prov.request(AdminQuorum(False))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        assert await prov.closed()
        assert h.cluster.replicas.quorum_fresh
        assert h.server.stats["not_allowed"] == 2


@on_mock_clock
async def test_garbage_and_oversize_frames_drop_only_that_peer(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        good = await provisioner(h, "good")
        garbage = await provisioner(h, "garbage")
        await garbage.framed.send_raw(HEADER.pack(16) + b"\xff" * 16)
        reply = await garbage.push()
        assert isinstance(reply, ErrorMsg) and reply.code == "bad_frame"
        assert await garbage.closed()
        huge = await provisioner(h, "huge")
        await huge.framed.send_raw(HEADER.pack(1 << 40))  # no body follows: the header alone is refused
        reply = await huge.push()
        assert isinstance(reply, ErrorMsg) and reply.code == "bad_frame" and "exceeds" in reply.message
        assert await huge.closed()
        assert seq_term(await good.request(Heartbeat(1))) == (1, 1)
        assert h.server.stats["peers_dropped"] == 2 and h.server.stats["internal_errors"] == 0


@on_mock_clock
async def test_lease_grace_grant_commit_and_stale_epoch_over_the_wire(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        peer = await provisioner(h)
        denied = await peer.request(LeaseAcquire("aws"))
        assert denied == LeaseDenied("aws", "grace", 35_000)
        await trio.sleep(GRACE_END)
        epoch = await granted(peer)
        assert epoch == Epoch(1, 1)
        assert await peer.request(FactCommit(intent("aws", epoch))) == FactAck(1, GRACE_END)  # the wall clock: mock
        stale = await peer.request(FactCommit(instance("aws", Epoch(1, 0), "i-1")))
        assert isinstance(stale, Rejected) and stale.reason == "invalid"  # seq 0 is never granted
        other = await peer.request(FactCommit(instance("aws", Epoch(1, 7), "i-1")))
        assert isinstance(other, Rejected) and other.reason == "stale_epoch"
        undeclared = await peer.request(LeaseAcquire("gcp"))
        assert isinstance(undeclared, Rejected) and undeclared.reason == "invalid"
        assert await peer.request(LeaseRelease("aws", epoch)) == Ack()
        assert await peer.request(LeaseAcquire("aws")) == LeaseGrant("aws", Epoch(1, 2), 30_000)


@on_mock_clock
async def test_holder_that_stops_renewing_loses_the_lease_after_ttl(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        d1, d2 = await provisioner(h, "d1"), await provisioner(h, "d2")
        await trio.sleep(GRACE_END)
        epoch = await granted(d1)
        await trio.sleep(20)
        assert isinstance(await d1.request(LeaseRenew("aws", epoch)), LeaseGrant)  # t=55, expires t=85
        await trio.sleep(29.999)
        assert await d2.request(LeaseAcquire("aws")) == LeaseDenied("aws", "held", 1)
        await trio.sleep(0.001)  # t=85: expired on the controller's clock
        assert trio.current_time() == 85.0
        assert await granted(d2) == Epoch(1, 2)
        denied = await d1.request(LeaseRenew("aws", epoch))
        assert denied == LeaseDenied("aws", "stale_epoch", 0)  # d2 holds it now, with another epoch


@on_mock_clock
async def test_quorum_switch_blocks_grants(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        peer = await provisioner(h)
        admin, _ = await h.join(Role.ADMIN, "ops")
        assert isinstance(await admin.request(AdminQuorum(False)), AdminReply)
        await trio.sleep(GRACE_END)
        assert (await peer.request(LeaseAcquire("aws"))).reason == "no_quorum"
        await admin.request(AdminQuorum(True))
        assert isinstance(await peer.request(LeaseAcquire("aws")), LeaseGrant)


@on_mock_clock
async def test_demand_is_pushed_on_every_change_in_pages(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        peer = await provisioner(h)
        admin, _ = await h.join(Role.ADMIN, "ops")
        many = [item(f"d{i:04}", i) for i in range(1200)]
        reply = await admin.request(AdminSetDemand(many))
        assert isinstance(reply, AdminReply) and reply.ok
        pages = [await peer.push() for _ in range(3)]
        assert all(isinstance(p, DemandPage) and p.snapshot_seq == 1 and p.page_count == 3 for p in pages)
        assert [i for p in pages for i in p.items] == many
        same = await admin.request(AdminSetDemand(many))
        assert same.ok and '"changed": false' in same.json
        await admin.request(AdminSetDemand([]))
        assert await peer.push() == DemandPage(2, 0, 1, ())
        bad = await admin.request(AdminSetDemand([item("x"), item("x")]))
        assert not bad.ok and "appears twice" in bad.json


@on_mock_clock
async def test_worker_join_status_and_loss_are_pushed_to_the_provisioner(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, heartbeat=15.0) as h:
        prov = await provisioner(h)
        await idle(GRACE_END, prov)
        epoch = await granted(prov)
        await prov.request(FactCommit(intent("aws", epoch, refs=("i-1", "i-2"))))
        worker, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1")
        assert isinstance(reply, JoinReply) and reply.accepted
        [host] = (await prov.push()).hosts
        assert (host.instance_ref, host.status, host.since) == ("i-1", HostStatus.JOINED, GRACE_END)
        assert await worker.request(WorkerStatus(HostStatus.BUSY)) == Ack()
        assert (await prov.push()).hosts[0].status is HostStatus.BUSY
        await worker.framed.aclose()
        await idle(14.999, prov)
        assert prov.pushes == []  # not lost yet
        await idle(0.001, prov)
        push = await prov.push()
        assert isinstance(push, HostStatePush) and push.hosts[0].status is HostStatus.LOST
        assert push.hosts[0].since == GRACE_END + 15.0  # one heartbeat timeout after the connection ended
        # Single use: the same token again is refused, and so is another instance's token.
        again, reply = await h.join(Role.WORKER, "w1", instance_ref="i-1", token="tok-i-1")
        assert isinstance(reply, ErrorMsg) and reply.code == "token_invalid" and "tok-i-1" not in reply.message
        cross, reply = await h.join(Role.WORKER, "w2", instance_ref="i-2", token="tok-i-1")
        assert isinstance(reply, ErrorMsg) and reply.code == "token_invalid"


@on_mock_clock
async def test_resync_sends_facts_and_hosts_then_demand(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        h.cluster.set_demand([item("a", 1)])
        prov = await provisioner(h, providers=("aws", "gcp"))
        await trio.sleep(GRACE_END)
        e_aws, e_gcp = await granted(prov, "aws"), await granted(prov, "gcp")
        for i in range(3):
            await prov.request(FactCommit(intent("aws", e_aws, f"op-a{i}", refs=(f"a{i}",))))
            await prov.request(FactCommit(intent("gcp", e_gcp, f"op-g{i}", refs=(f"g{i}",))))
        await h.join(Role.WORKER, "w", instance_ref="a0", token="tok-a0")
        assert isinstance(await prov.push(), HostStatePush)
        page, hosts_page = await prov.request_many(ResyncRequest(("aws",)), 2)
        assert isinstance(page, ResyncPage) and (page.page, page.page_count) == (0, 2)
        assert [f.fact.op_id for f in page.facts] == ["op-a0", "op-a1", "op-a2"]
        assert all(isinstance(f, CommittedFact) for f in page.facts)
        assert isinstance(hosts_page, ResyncPage) and (hosts_page.page, hosts_page.page_count) == (1, 2)
        assert [host.instance_ref for host in hosts_page.hosts] == ["a0"] and not hosts_page.facts
        assert await prov.push() == DemandPage(1, 0, 1, (item("a", 1),))
        everything = await prov.request(ResyncRequest(()))
        assert isinstance(everything, ResyncPage) and len(everything.facts) == 6
        empty_peer = await provisioner(h, "d9", providers=("none",))
        assert await empty_peer.request(ResyncRequest(())) == ResyncPage(0, 1, (), (), as_of=6)
        refused = await empty_peer.request(ResyncRequest(("aws",)))
        assert isinstance(refused, Rejected) and refused.reason == "invalid"


@on_mock_clock
async def test_failover_disconnects_clients_and_the_new_primary_serves_them(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        d1, d2 = await provisioner(h, "d1"), await provisioner(h, "d2")
        await trio.sleep(GRACE_END)
        old = await granted(d1)
        assert await d1.request(FactCommit(intent("aws", old))) == FactAck(1, GRACE_END)
        admin, _ = await h.join(Role.ADMIN, "ops")
        reply = await admin.request(AdminFailover(-1))
        assert reply.ok and '"primary": 1' in reply.json and '"term": 2' in reply.json
        assert await d1.closed() and await d2.closed() and await admin.closed()
        assert not h.server.sessions
        # The old primary now redirects; the new one serves, and its lease table is empty.
        peer, reply = await h.join(Role.PROVISIONER, "d1", replica=0, providers=("aws",))
        assert reply.redirect == "replica1.test:7001"
        d2 = await provisioner(h, "d2", replica=1)
        assert await d2.request(LeaseAcquire("aws")) == LeaseDenied("aws", "grace", 35_000)
        d1 = await provisioner(h, "d1", replica=1)
        new = await granted(d1)  # the holder on the latest fact gets it back at once
        assert new == Epoch(2, 1) and new > old
        stale = await d1.request(FactCommit(instance("aws", old, "i-1")))
        assert isinstance(stale, Rejected) and stale.reason == "stale_epoch"
        now = trio.current_time()
        assert await d1.request(FactCommit(instance("aws", new, "i-1"))) == FactAck(2, now)


@on_mock_clock
async def test_silent_peer_is_dropped_after_the_heartbeat_timeout(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, heartbeat=15.0) as h:
        prov = await provisioner(h)
        await trio.sleep(10)
        assert seq_term(await prov.request(Heartbeat(1))) == (1, 1)
        assert await prov.closed()
        assert trio.current_time() == 25.0  # 15 s after the last frame it sent


@on_mock_clock
async def test_a_peer_that_does_not_read_is_dropped_after_the_send_timeout(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, send=15.0) as h:
        client, server_side = trio.testing.lockstep_stream_pair()  # a send waits until the peer reads
        h.nursery.start_soon(h.server.handle_stream, server_side, 0, Role.PROVISIONER)
        peer = Peer(FramedStream(client))
        assert (await peer.request(Join(role=Role.PROVISIONER, identity="d1", providers=("aws",)))).accepted
        await trio.testing.wait_all_tasks_blocked()
        assert len(h.server.sessions) == 1
        start = trio.current_time()
        while h.server.sessions:  # noqa: ASYNC110 - we never read the demand snapshot that follows the join
            await trio.sleep(0.01)
        assert trio.current_time() - start == pytest.approx(15.0, abs=0.01)
        assert h.server.stats["peers_dropped"] == 1 and h.server.stats["internal_errors"] == 0


@on_mock_clock
async def test_tls_handshake_and_certificate_role_over_memory_streams(tmp_path: Path, certs: Path) -> None:
    from provisionerd.wire.tls import client_ssl_context, server_ssl_context

    async with memory_controller(tmp_path) as h:
        client, server_side = trio.testing.memory_stream_pair()
        server_tls = trio.SSLStream(server_side, server_ssl_context(certs), server_side=True)
        h.nursery.start_soon(h.server.handle_stream, server_tls, 0)  # no role given: it comes from the cert
        client_tls = trio.SSLStream(client, client_ssl_context(certs, Role.WORKER), server_hostname="localhost")
        peer = Peer(FramedStream(client_tls))
        reply = await peer.request(Join(role=Role.PROVISIONER, identity="posing", providers=("aws",)))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        assert "certificate role 'worker'" in reply.message


@on_mock_clock
async def test_heartbeats_are_answered_between_the_pages_of_a_resync(tmp_path: Path) -> None:
    """The resync goes out from a task of its own: a heartbeat sent right after a resync request of many pages is
    acknowledged before the resync's last page (it used to wait behind every page)."""
    async with memory_controller(tmp_path) as h:
        prov = await provisioner(h)
        epoch = Epoch(1, 1)
        h.cluster.store.append_many([intent("aws", epoch, f"op-{i}", refs=(f"r{i}",)) for i in range(2000)], "d1")
        await prov.framed.send(ResyncRequest(("aws",)), 7)
        await prov.framed.send(Heartbeat(1), 8)
        order: list[tuple[int, str]] = []
        pages = 0
        while True:
            envelope = await prov.receive_envelope()
            order.append((envelope.corr, type(envelope.msg).__name__))
            if isinstance(envelope.msg, ResyncPage):
                pages += 1
                if pages == envelope.msg.page_count:
                    break
        assert pages >= 4
        assert order.index((8, "HeartbeatAck")) < len(order) - 1, order
