"""Mutual TLS: who gets in, and which role they get."""

from __future__ import annotations

import functools
import shutil
import ssl

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives import serialization

from provisionerd.domain.errors import AuthError, ConfigError
from provisionerd.domain.model import Role
from provisionerd.pki import certs
from provisionerd.wire import messages as m
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.tls import client_ssl_context, peer_role, server_handshake, server_ssl_context


async def _handshake(server_ctx, client_ctx, hostname="localhost"):
    """Run both handshakes over an in-memory pair; return the streams and what each side raised (or None)."""
    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_ctx, server_side=True)
    client = trio.SSLStream(right, client_ctx, server_hostname=hostname)
    errors = {}

    async def run(name, stream):
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            errors[name] = exc
            await trio.aclose_forcefully(stream)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "server", server)
            nursery.start_soon(run, "client", client)
    return server, client, errors.get("server"), errors.get("client")


def _issue(tmp_path, ca_dir, name, cluster, role, uri=True):
    """A certificate + key signed by ``ca_dir``'s CA, saved as ``tmp_path/<name>.pem|key`` with ca.pem beside."""
    from cryptography import x509

    ca_pem, ca_key_path = certs.cert_paths(ca_dir, "ca")
    ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    cert, key = certs.make_role_cert(ca_cert, ca_key, cluster, role)
    if not uri:  # the same certificate minus its role URI
        cert, key = _without_uri(ca_cert, ca_key, cluster)
    shutil.copy(ca_pem, tmp_path / "ca.pem")
    (tmp_path / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / f"{name}.key").write_bytes(certs._key_pem(key))
    return tmp_path


def _without_uri(ca_cert, ca_key, cluster):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "no-role")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("nobody.example")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


@pytest.mark.parametrize("role", [Role.PROVISIONER, Role.WORKER, Role.ADMIN])
async def test_mutual_auth_gives_each_side_the_peer_role(certs_dir, role):
    server, client, server_err, client_err = await _handshake(
        server_ssl_context(certs_dir), client_ssl_context(certs_dir, role)
    )
    assert (server_err, client_err) == (None, None)
    assert peer_role(server) is role
    assert peer_role(client) is Role.CONTROLLER
    assert server.version() == "TLSv1.3"
    # And frames flow over it.
    framed_server, framed_client = FramedStream(server), FramedStream(client)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed_client.send, m.Heartbeat(7), 3)
        assert await framed_server.receive() == m.Envelope(3, m.Heartbeat(7))


async def test_the_controller_certificate_is_valid_for_127_0_0_1_and_not_other_names(certs_dir):
    ctx = client_ssl_context(certs_dir, Role.ADMIN)
    _, _, server_err, client_err = await _handshake(server_ssl_context(certs_dir), ctx, hostname="127.0.0.1")
    assert (server_err, client_err) == (None, None)
    _, _, _, client_err = await _handshake(server_ssl_context(certs_dir), ctx, hostname="controller.example")
    assert client_err is not None


async def test_a_client_without_a_certificate_is_refused(certs_dir):
    bare = ssl.create_default_context(cafile=str(certs_dir / "ca.pem"))
    server, client, server_err, _ = await _handshake(server_ssl_context(certs_dir), bare)
    assert isinstance(server_err, trio.BrokenResourceError)
    # TLS 1.3: the client learns on its first read.
    with pytest.raises(trio.BrokenResourceError):
        with trio.fail_after(10):
            await client.receive_some()


async def test_a_client_certificate_from_a_foreign_ca_is_refused(certs_dir, foreign_certs_dir):
    foreign = client_ssl_context(foreign_certs_dir, Role.PROVISIONER)
    foreign.load_verify_locations(cafile=str(certs_dir / "ca.pem"))  # it even trusts our server
    server, client, server_err, client_err = await _handshake(server_ssl_context(certs_dir), foreign)
    assert isinstance(server_err, trio.BrokenResourceError)
    if client_err is None:
        with pytest.raises(trio.BrokenResourceError):
            with trio.fail_after(10):
                await client.receive_some()


async def test_a_client_refuses_a_server_from_a_foreign_ca(certs_dir, foreign_certs_dir):
    _, _, _, client_err = await _handshake(
        server_ssl_context(foreign_certs_dir), client_ssl_context(certs_dir, Role.PROVISIONER)
    )
    assert isinstance(client_err, trio.BrokenResourceError)
    assert "CERTIFICATE_VERIFY_FAILED" in repr(client_err.__cause__)


async def test_a_certificate_for_another_cluster_from_our_ca_has_no_role_here(certs_dir, tmp_path):
    other = _issue(tmp_path, certs_dir, "provisioner", "beta", Role.PROVISIONER)
    server, _, server_err, _ = await _handshake(
        server_ssl_context(certs_dir), client_ssl_context(other, Role.PROVISIONER)
    )
    assert server_err is None  # same CA, so TLS accepts it...
    with pytest.raises(AuthError, match="cluster 'beta'"):
        peer_role(server)  # ...but it names another cluster
    assert peer_role(server, cluster="beta") is Role.PROVISIONER


async def test_a_certificate_without_a_role_uri_is_refused(certs_dir, tmp_path):
    other = _issue(tmp_path, certs_dir, "worker", "alpha", Role.WORKER, uri=False)
    server, _, server_err, _ = await _handshake(server_ssl_context(certs_dir), client_ssl_context(other, "worker"))
    assert server_err is None
    with pytest.raises(AuthError, match="0 provisionerd role URIs"):
        peer_role(server)


def test_missing_files_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot load TLS files"):
        server_ssl_context(tmp_path)


async def test_framed_tls_over_loopback_tcp(certs_dir):
    # The whole stack on a real socket: listener, TLS with client certs, frames both ways.
    server_ctx = server_ssl_context(certs_dir)
    seen = []

    async def serve(stream):
        ssl_stream = trio.SSLStream(stream, server_ctx, server_side=True)
        await ssl_stream.do_handshake()
        framed = FramedStream(ssl_stream)
        env = await framed.receive()
        seen.append((peer_role(ssl_stream), env))
        await framed.send(m.HeartbeatAck(env.msg.seq, term=4), env.corr)
        await ssl_stream.aclose()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            stream = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1", port, ssl_context=client_ssl_context(certs_dir, Role.PROVISIONER)
            )
            framed = FramedStream(stream)
            await framed.send(m.Heartbeat(11), corr=5)
            assert await framed.receive() == m.Envelope(5, m.HeartbeatAck(11, 4))
            await stream.aclose()
            nursery.cancel_scope.cancel()
    assert seen == [(Role.PROVISIONER, m.Envelope(5, m.Heartbeat(11)))]


async def _alert_seen_by(client_ctx, certs_dir) -> str:
    """What a client of ``client_ctx`` reads after ``server_handshake`` refused it: the SSL error's text."""
    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_ssl_context(certs_dir), server_side=True)
    client = trio.SSLStream(right, client_ctx, server_hostname="localhost")

    async def serve() -> None:
        with pytest.raises(trio.BrokenResourceError):
            await server_handshake(server)
        await trio.aclose_forcefully(server)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            with pytest.raises(trio.BrokenResourceError) as refused:
                await client.do_handshake()
                await client.receive_some()  # TLS 1.3: the client's handshake completes; the alert comes next
    return str(refused.value.__cause__)


async def test_a_refused_handshake_sends_the_alert_that_says_why(certs_dir, foreign_certs_dir):
    bare = ssl.create_default_context(cafile=str(certs_dir / "ca.pem"))
    assert "CERTIFICATE_REQUIRED" in await _alert_seen_by(bare, certs_dir)
    foreign = client_ssl_context(foreign_certs_dir, Role.PROVISIONER)
    foreign.load_verify_locations(cafile=str(certs_dir / "ca.pem"))
    assert "UNKNOWN_CA" in await _alert_seen_by(foreign, certs_dir)
