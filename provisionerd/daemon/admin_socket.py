"""The daemon's local admin socket: one JSON request line in, one JSON reply line out, then close.

Commands: ``{"cmd": "status"}`` (answered at once from ``status()``) and whatever the daemon registers in
``commands``, each an async :class:`Command` (``orphan_action``: see ``provisionerd.daemon.orphans.OrphanActions``).
The socket is a unix socket (file mode 0600: local root/owner only), so no authentication beyond file permissions;
a command is handed the peer's uid (``SO_PEERCRED``) for its audit.

Everything is bounded, so a stuck or hostile client costs little: the request line (``MAX_REQUEST`` bytes, read
within ``CLIENT_TIMEOUT``), the reply's send (``CLIENT_TIMEOUT``), the connections in progress
(``MAX_CONNECTIONS``: more are answered ``busy`` at once), and each command's run (its own ``timeout(request)``:
past it the reply says ``pending``; a command that must finish what it started runs that part outside the
request, see ``OrphanActions``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

log = logging.getLogger(__name__)

MAX_REQUEST = 4096
CLIENT_TIMEOUT = 5.0
MAX_CONNECTIONS = 16
MAX_REPLY = 1 << 22  # what the blocking client reads at most


@attrs.frozen
class Command:
    """An async admin command: ``run(request, peer_uid)`` returns the reply document (``{"ok": ..., ...}``);
    ``timeout(request)`` bounds it (seconds); the socket answers ``pending`` when it passes."""

    run: Callable[[dict[str, Any], int | None], Awaitable[dict[str, Any]]]
    timeout: Callable[[dict[str, Any]], float]


async def serve_admin_socket(
    path: Path,
    status: Callable[[], dict[str, Any]],
    commands: Mapping[str, Command] | None = None,
    *,
    on_refusal: Callable[[str, str], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``path`` until cancelled; removes a stale socket file first and the socket file on exit.
    ``on_refusal(code, message)`` hears every request the socket itself refuses (the daemon logs and counts them:
    ``daemon.admin_guard``); each such reply names its ``refused`` code."""
    commands = dict(commands or {})

    def refuse(code: str, message: str, **extra: Any) -> dict[str, Any]:
        if on_refusal is not None:
            on_refusal(code, message)
        return {"ok": False, "refused": code, "error": message, **extra}

    # A local directory and socket file, once at start and once at exit: not worth a worker thread each.
    path.parent.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    if path.is_socket():  # noqa: ASYNC240
        path.unlink()  # noqa: ASYNC240
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    in_progress = 0
    try:
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()

        async def handle(stream: trio.SocketStream) -> None:
            nonlocal in_progress
            async with stream:
                if in_progress >= MAX_CONNECTIONS:
                    await _send(
                        stream, refuse("busy", "busy: too many admin requests in progress; try again", busy=True)
                    )
                    return
                in_progress += 1
                try:
                    line: bytes | None = None
                    with trio.move_on_after(CLIENT_TIMEOUT):
                        try:
                            line = await _read_line(stream)
                        except trio.BrokenResourceError:
                            return  # the client went away before asking anything
                    if line is None:
                        reply = refuse("no_request", f"no request line within {CLIENT_TIMEOUT:g}s")
                    else:
                        reply = await _answer(line, status, commands, _peer_uid(stream), refuse)
                    await _send(stream, reply)
                finally:
                    in_progress -= 1

        await trio.serve_listeners(handle, [listener])
    finally:
        sock.close()
        try:  # synchronous, so a cancellation cannot interrupt it (no shield needed)
            path.unlink()  # noqa: ASYNC240
        except FileNotFoundError:
            pass


async def _read_line(stream: trio.SocketStream) -> bytes:
    """The request line (without its newline), or what came before the client stopped sending; more than
    ``MAX_REQUEST`` bytes without a newline returns ``MAX_REQUEST + 1`` bytes (too large)."""
    data = bytearray()
    while b"\n" not in data and len(data) <= MAX_REQUEST:
        chunk = await stream.receive_some(MAX_REQUEST)
        if not chunk:
            break
        data += chunk
    line, newline, _ = bytes(data).partition(b"\n")
    return line if newline or len(line) <= MAX_REQUEST else line[: MAX_REQUEST + 1]


async def _send(stream: trio.SocketStream, reply: dict[str, Any]) -> None:
    with trio.move_on_after(CLIENT_TIMEOUT):
        try:
            await stream.send_all(json.dumps(reply, default=str).encode() + b"\n")
        except trio.BrokenResourceError:
            pass  # the client went away: its loss


async def _answer(
    line: bytes,
    status: Callable[[], dict[str, Any]],
    commands: Mapping[str, Command],
    peer_uid: int | None,
    refuse: Callable[[str, str], dict[str, Any]],
) -> dict[str, Any]:
    if len(line) > MAX_REQUEST:
        return refuse("too_large", f"request too large (more than {MAX_REQUEST} bytes)")
    try:
        request = json.loads(line or b"null")
    except (ValueError, RecursionError):  # RecursionError: 4 KiB of nested brackets
        return refuse("not_json", "request is not JSON")
    cmd = request.get("cmd") if isinstance(request, dict) else None
    if cmd == "status":
        return {"ok": True, "status": status()}
    command = commands.get(cmd) if isinstance(cmd, str) else None
    if command is None:
        known = ", ".join(repr(name) for name in ("status", *sorted(commands)))
        return refuse("unknown_command", f"unknown command (known: {known})")
    timeout = command.timeout(request)
    with trio.move_on_after(timeout):
        return await command.run(request, peer_uid)
    return {
        "ok": False,
        "pending": True,
        "error": f"no answer within {timeout:g}s; the daemon finishes what it started: see its events log",
    }


def _peer_uid(stream: trio.SocketStream) -> int | None:
    """The connecting process's uid (Linux ``SO_PEERCRED``), for the audit; ``None`` where it cannot be had."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", raw)
    except (OSError, struct.error):
        return None
    return uid


def request(path: Path, document: Mapping[str, Any], timeout: float = CLIENT_TIMEOUT) -> dict[str, Any]:
    """Blocking client for the CLI: send ``document`` as one line, return the decoded reply, all within
    ``timeout`` seconds. Raises ``OSError`` (``FileNotFoundError``/``ConnectionRefusedError`` when no daemon
    listens, ``TimeoutError`` when it does not answer in time) or ``ValueError`` (a reply that is not a JSON
    object)."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(document).encode() + b"\n")
        data = bytearray()
        while len(data) < MAX_REPLY:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply within {timeout:g}s")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = json.loads(bytes(data))
    if not isinstance(reply, dict):
        raise ValueError("the daemon's reply is not a JSON object")
    return reply


def query(path: Path, cmd: str = "status", timeout: float = CLIENT_TIMEOUT) -> dict[str, Any]:
    """``request(path, {"cmd": cmd}, timeout)``."""
    return request(path, {"cmd": cmd}, timeout)
