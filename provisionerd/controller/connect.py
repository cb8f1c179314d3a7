"""Mutual-TLS streams to the controller: the production ``StreamFactory`` for ``ControllerSession``.

The context is built from the config's explicit paths (``[tls] ca, cert, key``) with the wire layer's settings:
TLS 1.3 only, the server verified against the cluster CA and its host name, our certificate presented. After the
handshake the peer must carry the ``controller`` role of *our* cluster (``wire.tls.peer_role``), so a certificate of
another role or cluster is refused even if the CA matches.
"""

from __future__ import annotations

import ssl

import trio

from provisionerd.config.loader import Config
from provisionerd.controller.session_settings import StreamFactory
from provisionerd.domain.errors import AuthError, ConfigError
from provisionerd.domain.model import Role
from provisionerd.wire.tls import ClusterSSLContext, peer_role


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
        host, port = parse_address(address)
        tcp = await trio.open_tcp_stream(host, port)
        stream = trio.SSLStream(tcp, ctx, server_hostname=server_name or host)
        try:
            await stream.do_handshake()
            role = peer_role(stream, config.cluster)
            if role is not Role.CONTROLLER:
                raise AuthError(f"{address} presented a {role.value!r} certificate, not a controller's")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream

    return connect
