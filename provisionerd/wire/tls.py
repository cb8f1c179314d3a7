"""Mutual TLS for the controller link: contexts from a certs directory, and the peer's role from its certificate.

Both sides require TLS 1.3 and a certificate chaining to the cluster CA (``certs_dir/ca.pem``). The server refuses
a client without a certificate or with one from another CA during the handshake. With TLS 1.3 the client's own
handshake may still complete (its certificate is checked after the server's Finished), so a refused client sees
the failure on its first receive, and the server sees ``trio.BrokenResourceError`` from ``do_handshake``.

The refused client is told why: ``server_handshake`` sends the TLS alert OpenSSL made for the refusal
(``certificate_required`` without a certificate, ``unknown_ca`` for a certificate of another CA,
``bad_certificate``, ``certificate_expired``...), which ``trio.SSLStream`` would otherwise drop with the connection.

Usage (server)::

    ssl_stream = trio.SSLStream(tcp_stream, server_ssl_context(certs_dir), server_side=True)
    await ssl_stream.do_handshake()
    role = peer_role(ssl_stream)          # AuthError if the certificate carries no role of this cluster

and a client wraps with ``client_ssl_context(certs_dir, Role.PROVISIONER)`` and ``server_hostname=<host>``, then
may check ``peer_role(ssl_stream) is Role.CONTROLLER``.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import trio

from provisionerd.domain.errors import AuthError, ConfigError
from provisionerd.domain.model import Role
from provisionerd.pki.certs import cert_paths, parse_role_uri, read_cluster


class ClusterSSLContext(ssl.SSLContext):
    """An ``SSLContext`` that remembers its cluster, so ``peer_role`` can check a peer belongs to it."""

    cluster: str = ""


def _context(purpose: int, certs_dir: Path | str, name: str) -> ClusterSSLContext:
    ctx = ClusterSSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ca_pem, _ = cert_paths(certs_dir, "ca")
    pem, key = cert_paths(certs_dir, name)
    try:
        ctx.load_verify_locations(cafile=str(ca_pem))
        ctx.load_cert_chain(certfile=str(pem), keyfile=str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files for {name!r} from {str(certs_dir)!r}: {exc}") from None
    ctx.cluster = read_cluster(certs_dir)
    return ctx


def server_ssl_context(certs_dir: Path | str, name: str = "controller") -> ClusterSSLContext:
    """The server side: presents ``<name>.pem`` and requires a client certificate from the cluster CA."""
    return _context(ssl.PROTOCOL_TLS_SERVER, certs_dir, name)


def client_ssl_context(certs_dir: Path | str, role: Role | str) -> ClusterSSLContext:
    """The client side: presents ``<role>.pem``, verifies the server against the CA and its host name."""
    return _context(ssl.PROTOCOL_TLS_CLIENT, certs_dir, Role(role).value)


async def server_handshake(ssl_stream: trio.SSLStream[Any], alert_timeout: float = 1.0) -> None:
    """``ssl_stream.do_handshake()``; when it fails, first send the peer the alert that says why.

    trio marks the stream broken on the ``SSLError`` without writing what OpenSSL queued for the peer (the alert
    record), so it is taken from the stream's outgoing buffer and written to the transport here, best effort
    within ``alert_timeout``. ``tests/wire/test_tls.py`` fails if a trio release moves that buffer.

    Raises:
        trio.BrokenResourceError: the handshake failed (``__cause__`` is the ``ssl.SSLError``).
    """
    try:
        await ssl_stream.do_handshake()
    except trio.BrokenResourceError:
        outgoing = getattr(ssl_stream, "_outgoing", None)
        pending = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
        if pending:
            with trio.move_on_after(alert_timeout):
                try:
                    await ssl_stream.transport_stream.send_all(pending)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                    pass
        raise


def peer_role(ssl_stream: Any, cluster: str | None = None) -> Role:
    """The role bound into the peer's verified certificate (after the handshake).

    ``cluster`` defaults to the cluster of the stream's ``ClusterSSLContext``. The role is the SAN URI
    ``provisionerd://<cluster>/<role>``; exactly one such URI must be present.

    Raises:
        AuthError: no certificate, no role URI or several, an unknown role, or a different cluster.
    """
    expected = cluster if cluster is not None else getattr(ssl_stream.context, "cluster", "") or None
    cert = ssl_stream.getpeercert()
    if not cert:
        raise AuthError("the peer presented no certificate")
    found = [
        parsed
        for kind, value in cert.get("subjectAltName", ())
        if kind == "URI" and (parsed := parse_role_uri(value)) is not None
    ]
    if len(found) != 1:
        raise AuthError(f"the peer certificate carries {len(found)} provisionerd role URIs, expected exactly 1")
    peer_cluster, role_value = found[0]
    if expected is not None and peer_cluster != expected:
        raise AuthError(f"the peer certificate is for cluster {peer_cluster!r}, not {expected!r}")
    try:
        return Role(role_value)
    except ValueError:
        raise AuthError(f"the peer certificate names an unknown role {role_value!r}") from None
