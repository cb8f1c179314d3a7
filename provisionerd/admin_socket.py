"""The daemon's local admin socket: one JSON request line in, one JSON reply line out, then close.

Only ``{"cmd": "status"}`` exists for now. The socket is a unix socket (file mode 0600: local root/owner only), so
no authentication beyond file permissions. Requests are bounded (4 KiB, 5 s) so a stuck client costs nothing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger(__name__)

MAX_REQUEST = 4096
CLIENT_TIMEOUT = 5.0


async def serve_admin_socket(
    path: Path, status: Callable[[], dict[str, Any]], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``path`` until cancelled; removes a stale socket file first and the socket file on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        path.unlink()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()

        async def handle(stream: trio.SocketStream) -> None:
            async with stream:
                with trio.move_on_after(CLIENT_TIMEOUT):
                    reply = _answer(await _read_line(stream), status)
                    await stream.send_all(json.dumps(reply, default=str).encode() + b"\n")

        await trio.serve_listeners(handle, [listener])
    finally:
        sock.close()
        with trio.CancelScope(shield=True):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


async def _read_line(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while b"\n" not in data and len(data) <= MAX_REQUEST:
        chunk = await stream.receive_some(MAX_REQUEST)
        if not chunk:
            break
        data += chunk
    return bytes(data[:MAX_REQUEST + 1])


def _answer(line: bytes, status: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        request = json.loads(line.split(b"\n", 1)[0] or b"null")
    except ValueError:
        return {"ok": False, "error": "request is not JSON"}
    if not isinstance(request, dict) or request.get("cmd") != "status":
        return {"ok": False, "error": "unknown command (only {\"cmd\": \"status\"})"}
    return {"ok": True, "status": status()}


def query(path: Path, cmd: str = "status", timeout: float = CLIENT_TIMEOUT) -> dict[str, Any]:
    """Blocking client for the CLI: send ``{"cmd": cmd}``, return the decoded reply. Raises OSError/ValueError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps({"cmd": cmd}).encode() + b"\n")
        data = bytearray()
        while len(data) < (1 << 22):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = json.loads(bytes(data))
    if not isinstance(reply, dict):
        raise ValueError("the daemon's reply is not a JSON object")
    return reply
