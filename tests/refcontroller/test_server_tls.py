"""The controller on real sockets with mutual TLS (real clock, generous timeouts): certificates decide roles."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
from rc_client import Peer, on_real_clock, seq_term, tls_peer, track
from rc_factories import intent, item
from rigs import backends

from provisionerd.domain.model import Epoch, Role
from provisionerd.wire.framing import HEADER, FramedStream
from provisionerd.wire.messages import (
    DemandPage,
    ErrorMsg,
    FactCommit,
    Heartbeat,
    Join,
    JoinReply,
)
from refcontroller import addresses
from refcontroller.admin import AdminClient, AdminError
from refcontroller.api import open_refcontroller


async def join_provisioner(certs: Path, address: str, identity: str = "d1") -> tuple[Peer, JoinReply]:
    peer = await tls_peer(certs, address, Role.PROVISIONER)
    reply = await peer.request(Join(role=Role.PROVISIONER, identity=identity, providers=("aws",)))
    assert isinstance(reply, JoinReply), reply
    return peer, reply


async def refused(peer: Peer) -> bool:
    """True when the controller ended the connection without serving it (EOF or a TLS alert)."""
    try:
        await peer.framed.send(Join(role=Role.PROVISIONER, identity="x"), 1)
        return await peer.framed.receive() is None
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return True


@on_real_clock
async def test_standby_redirects_and_primary_pushes_demand_after_join(certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=3) as ctl:
        assert await ctl.set_demand([item("a", 2)]) == 1
        peer, reply = await join_provisioner(certs, ctl.addresses[2])
        assert (reply.accepted, reply.redirect, reply.term) == (False, ctl.addresses[0], 1)
        peer, reply = await join_provisioner(certs, reply.redirect)
        assert reply.accepted and reply.primary
        assert await peer.push() == DemandPage(1, 0, 1, (item("a", 2),))
        assert await ctl.set_demand([item("a", 5)]) == 2
        assert await peer.push() == DemandPage(2, 0, 1, (item("a", 5),))


@on_real_clock
async def test_no_certificate_and_foreign_ca_are_refused(certs: Path, foreign_certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=1) as ctl:
        host, port = addresses.parse(ctl.addresses[0])
        no_cert = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        stream = track(await trio.open_ssl_over_tcp_stream(host, port, ssl_context=no_cert))
        assert await refused(Peer(FramedStream(stream)))
        # A client of another CA cannot even verify the controller; make it trust ours to reach the check.
        from provisionerd.wire.tls import client_ssl_context

        foreign = client_ssl_context(foreign_certs, Role.PROVISIONER)
        foreign.load_verify_locations(cafile=str(certs / "ca.pem"))
        stream = track(await trio.open_ssl_over_tcp_stream(host, port, ssl_context=foreign))
        assert await refused(Peer(FramedStream(stream)))
        peer, reply = await join_provisioner(certs, ctl.addresses[0])  # still serving the right ones
        assert reply.accepted
        status = await ctl.status()
        assert status["stats"]["peers_dropped"] == 2 and "internal_errors" not in status["stats"]
        assert status["gate"]["refusals"] == {"handshake": {"-": 2}}


@pytest.mark.process
@on_real_clock
async def test_openssl_s_client_without_a_certificate_prints_the_alert_the_controller_sent(
    certs: Path, tmp_path: Path
) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=1) as ctl:
        argv = [
            backends.need("openssl", "Debian: openssl"),
            "s_client",
            "-connect",
            ctl.addresses[0],
            "-CAfile",
            str(certs / "ca.pem"),
            "-ign_eof",
        ]
        with trio.fail_after(20):
            result = await trio.run_process(argv, stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
        said = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
        assert "alert certificate required" in said and "alert number 116" in said, said


@on_real_clock
async def test_role_comes_from_the_certificate(certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=1) as ctl:
        admin = await tls_peer(certs, ctl.addresses[0], Role.ADMIN)
        reply = await admin.request(Join(role=Role.PROVISIONER, identity="posing", providers=("aws",)))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        assert await admin.closed()
        admin = await tls_peer(certs, ctl.addresses[0], Role.ADMIN)
        assert (await admin.request(Join(role=Role.ADMIN, identity="ops"))).accepted
        reply = await admin.request(FactCommit(intent("aws", Epoch(1, 1))))
        assert isinstance(reply, ErrorMsg) and reply.code == "not_allowed"
        assert await admin.closed()


@on_real_clock
async def test_garbage_and_oversize_frames_drop_that_peer_only(certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=1) as ctl:
        good, _ = await join_provisioner(certs, ctl.addresses[0], "good")
        bad, _ = await join_provisioner(certs, ctl.addresses[0], "bad")
        await bad.framed.send_raw(HEADER.pack(64) + bytes(range(64)))
        error = await bad.push()
        if isinstance(error, DemandPage):  # the join's demand push and the read of the garbage race each other
            error = await bad.push()
        assert isinstance(error, ErrorMsg) and error.code == "bad_frame"
        assert await bad.closed()
        huge, _ = await join_provisioner(certs, ctl.addresses[0], "huge")
        await huge.framed.send_raw(HEADER.pack(2 << 20) + b"x" * 1024)
        await huge.closed()
        errors = [p for p in huge.pushes if isinstance(p, ErrorMsg)]  # the join's demand push may come either side
        assert [e.code for e in errors] == ["bad_frame"] and "exceeds" in errors[0].message, huge.pushes
        assert seq_term(await good.request(Heartbeat(3))) == (3, 1)


@on_real_clock
async def test_failover_disconnects_clients_and_the_new_primary_serves_them(certs: Path, tmp_path: Path) -> None:
    async with open_refcontroller(certs, tmp_path, replicas=3) as ctl:
        peer, reply = await join_provisioner(certs, ctl.addresses[0])
        assert reply.accepted and reply.term == 1
        result = await ctl.fail_over()
        assert result == {"primary": 1, "previous": 0, "term": 2}
        assert await peer.closed()
        peer, reply = await join_provisioner(certs, ctl.addresses[0])
        assert not reply.accepted and reply.redirect == ctl.addresses[1]
        peer, reply = await join_provisioner(certs, reply.redirect)
        assert reply.accepted and reply.term == 2
        status = await ctl.status()  # the admin client followed the redirect too
        assert status["primary"] == 1 and status["term"] == 2 and status["leases"] == []
        sessions = [(s["role"], s["identity"]) for s in status["sessions"]]
        assert sessions == [("admin", "refcontroller-admin"), ("provisioner", "d1")]
        with pytest.raises(AdminError, match="already the primary"):
            await ctl.fail_over(1)


@on_real_clock
async def test_admin_client_reports_an_unreachable_controller(certs: Path) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(AdminError, match="no controller primary reachable"):
            await AdminClient(certs, [f"127.0.0.1:{port}"], timeout=10).status()
