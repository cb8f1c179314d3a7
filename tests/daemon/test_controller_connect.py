"""The daemon's TCP + TLS connection to the controller (controller/connect.py) on a real socket."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from provisionerd.controller import connect
from provisionerd.domain.model import Role
from provisionerd.pki.certs import init_certs
from provisionerd.wire.tls import client_ssl_context, server_ssl_context


def test_the_link_socket_has_the_fixed_receive_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receive buffer is set (the kernel doubles it), so the window the controller may fill ahead of its next
    heartbeat ack is bounded; left alone, Linux grows it from ``tcp_rmem``'s default towards its maximum."""
    init_certs(tmp_path, "testcluster")
    monkeypatch.setattr(connect, "RECEIVE_BUFFER", 40_000)  # not the kernel's default, whatever the host's is

    async def main() -> int:
        listeners = await trio.open_ssl_over_tcp_listeners(0, server_ssl_context(tmp_path), host="127.0.0.1")
        port = listeners[0].transport_listener.socket.getsockname()[1]
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                server = await listeners[0].accept()
                await server.do_handshake()
                await server.aclose()

            nursery.start_soon(serve)
            with trio.fail_after(20):
                stream = await connect.open_controller_stream(
                    f"127.0.0.1:{port}", client_ssl_context(tmp_path, Role.PROVISIONER), "127.0.0.1"
                )
            tcp = stream.transport_stream
            assert isinstance(tcp, trio.SocketStream)
            size = int(tcp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
            await stream.aclose()
        await listeners[0].aclose()
        return size

    assert trio.run(main) == 2 * 40_000
