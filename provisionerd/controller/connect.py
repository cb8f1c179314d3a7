"""Mutual-TLS streams to the controller: the production ``StreamFactory`` for ``ControllerSession``.

The context is built from the config's explicit paths (``[tls] ca, cert, key``) with the wire layer's settings:
TLS 1.3 only, the server verified against the cluster CA and its host name, our certificate presented. After the
handshake the peer must carry the ``controller`` role of *our* cluster (``wire.tls.peer_role``), so a certificate of
another role or cluster is refused even if the CA matches. The socket's receive buffer is fixed (``RECEIVE_BUFFER``)
before the handshake, so the window the controller sees is never wider than it.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import trio

from provisionerd.config.loader import Config
from provisionerd.controller.session_settings import StreamFactory
from provisionerd.domain.errors import AuthError, ConfigError
from provisionerd.domain.model import Role
from provisionerd.wire.tls import ClusterSSLContext, peer_role

#: The link's socket receive buffer (the kernel doubles it for its bookkeeping). The controller's replies travel
#: behind its resync pages on the same stream, and a heartbeat ack waits for every page byte ahead of it to be read
#: and folded here: left to itself Linux grows the window to megabytes (``tcp_rmem``), seconds of folding at
#: 100,000 machines. A fixed buffer of about one page keeps the pages flowing while this side folds the one it
#: holds, and bounds how far a fast controller can run ahead of the next ack (docs/protocol.md §6.3): a live_100k
#: resync on a loaded 2-core machine saw heartbeat round trips of 20-50 ms with 64 KiB, 40-330 ms with 128-256 KiB.
#: Over a long round trip it also bounds the link's rate (window / RTT: ~13 MB/s at 10 ms).
RECEIVE_BUFFER = 64 * 1024


def parse_address(text: str) -> tuple[str, int]:
    """``"host:7400"`` -> ``("host", 7400)``; ``"[::1]:7400"`` -> ``("::1", 7400)``."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"address must look like HOST:PORT, not {text!r}")
    return host, int(port)


def client_context(config: Config) -> ClusterSSLContext:
    """The client-side context from ``config.tls``. Raises ``ConfigError`` if the files cannot be loaded."""
    ctx = ClusterSSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    tls = config.tls
    try:
        ctx.load_verify_locations(cafile=str(tls.ca))
        ctx.load_cert_chain(certfile=str(tls.cert), keyfile=str(tls.key))
    except (OSError, ssl.SSLError) as exc:
        # The message names files and the OpenSSL reason, never key material.
        raise ConfigError("cannot load the TLS files", [f"tls: {exc}"]) from None
    ctx.cluster = config.cluster
    return ctx


def tls_connector(config: Config, context: ClusterSSLContext | None = None) -> StreamFactory:
    """A ``StreamFactory`` opening TCP + TLS to an address and checking the peer is this cluster's controller."""
    ctx = context if context is not None else client_context(config)
    server_name = config.controller.server_name

    async def connect(address: str) -> trio.abc.Stream:
        stream = await open_controller_stream(address, ctx, server_name)
        try:
            role = peer_role(stream, config.cluster)
            if role is not Role.CONTROLLER:
                raise AuthError(f"{address} presented a {role.value!r} certificate, not a controller's")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream

    return connect


async def open_controller_stream(
    address: str, ctx: ssl.SSLContext, server_name: str | None = None
) -> trio.SSLStream[Any]:
    """TCP to ``address`` with the link's receive buffer (``RECEIVE_BUFFER``), then the TLS handshake (the server
    verified against ``ctx``'s CA as ``server_name``, or the address's host). The caller checks the peer's role."""
    host, port = parse_address(address)
    tcp = await trio.open_tcp_stream(host, port)
    stream = trio.SSLStream(tcp, ctx, server_hostname=server_name or host)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream
