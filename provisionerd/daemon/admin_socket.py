"""The daemon's local admin socket: one JSON request line in, one JSON reply line out, then close.

Commands: ``{"cmd": "status"}`` (answered at once from ``status()``) and whatever the daemon registers in
``commands``, each an async :class:`Command` (``orphan_action``: see ``provisionerd.daemon.orphans.OrphanActions``).
Who may ask (issue 16): the socket file is 0600 in a directory of mode 0700 made whatever the umask, and the daemon
refuses to start (``InsecurePath``, exit 2) on a socket directory another user could change, so no one can swap the
socket for a fake one. Each connection's peer is then checked (``SO_PEERCRED``, ``peer_refusal``): only the
daemon's own uid or root, and never a process the daemon started (a provider plugin or one of its children runs as
the daemon's user; its ancestry, read from ``/proc``, leads to the daemon). A refused peer gets one ``refused``
reply; refusals are logged (uid, pid, reason) and counted (``AdminSocketCounts``). Every accepted request is logged
with its peer's uid, and a command is handed that uid for its audit. A plugin that detaches itself completely
(double fork and a new session) is indistinguishable from another process of the daemon's user: run plugins as
another user where that matters.

Everything is bounded, so a stuck or hostile client costs little: the request line (``MAX_REQUEST`` bytes, read
within ``CLIENT_TIMEOUT``), the reply's send (``CLIENT_TIMEOUT``), the connections in progress
(``MAX_CONNECTIONS``: more are answered ``busy`` at once), and each command's run (its own ``timeout(request)``:
past it the reply says ``pending``; a command that must finish what it started runs that part outside the
request, see ``OrphanActions``).

One daemon per socket (issue 22): a socket file left by a daemon that died is removed at start, but one that still
answers never is. The daemon then refuses to start (``AdminSocketInUse``, exit 2) and names the process that holds
it (its pid from ``SO_PEERCRED``, its identity and instance from its ``status``), so a second start of one config
cannot steal ``status`` and ``orphans`` from the first. Two starts racing each other are kept apart by an exclusive
``flock`` on ``<socket>.lock`` (0600, next to the socket, held while the socket is served and never removed: a
removed lock file could be locked twice).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from provisionerd.domain.errors import ProvisionerdError
from provisionerd.telemetry.files import check_private_dir, make_private_dir, open_private

log = logging.getLogger(__name__)

MAX_REQUEST = 4096
CLIENT_TIMEOUT = 5.0
MAX_CONNECTIONS = 16
MAX_REPLY = 1 << 22  # what the blocking client reads at most


class RefusalNotes(Protocol):
    """Who hears of the requests the socket itself refuses (``daemon.admin_guard.AdminRefusals``)."""

    def note(self, code: str, message: str) -> None: ...


@attrs.frozen
class Command:
    """An async admin command: ``run(request, peer_uid)`` returns the reply document (``{"ok": ..., ...}``);
    ``timeout(request)`` bounds it (seconds); the socket answers ``pending`` when it passes."""

    run: Callable[[dict[str, Any], int | None], Awaitable[dict[str, Any]]]
    timeout: Callable[[dict[str, Any]], float]


@attrs.frozen
class Peer:
    """The process at the other end of an admin connection (``SO_PEERCRED``; None where it cannot be had)."""

    pid: int | None
    uid: int | None


class AdminSocketInUse(ProvisionerdError):
    """Another live process serves this admin socket (it answered, or holds its lock): the daemon refuses to start
    rather than take the socket away from it. ``pid`` (None where it cannot be had) and ``holder`` name it."""

    def __init__(self, path: str, pid: int | None, holder: str = "") -> None:
        self.path = path
        self.pid = pid
        self.holder = holder
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"admin socket {path!r} is in use by {who}{f' ({holder})' if holder else ''}: another daemon runs with "
            "this config; stop it first, or give this one its own daemon.admin_socket"
        )


@attrs.frozen
class SocketHolder:
    """The process that answers on an admin socket: its pid (``SO_PEERCRED``) and what its status says of it."""

    pid: int | None
    holder: str = ""


def holder_of(path: Path, timeout: float = 2.0) -> SocketHolder | None:  # noqa: ASYNC109 - a blocking helper
    """The live process serving ``path``, or None when nothing answers there (no file, or a stale one: connection
    refused). Blocking, bounded by ``timeout``: connect, read the listener's pid, ask ``status`` for its identity
    and instance. A listener that accepts but does not answer in time is still a live holder."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        pid = _peer_of_socket(sock).pid
        holder = ""
        try:
            sock.sendall(b'{"cmd": "status"}\n')
            data = bytearray()
            while len(data) < MAX_REPLY and (chunk := sock.recv(65536)):
                data += chunk
            status = json.loads(bytes(data)).get("status", {})
            process = status.get("process", {})
            holder = f"identity {status.get('identity')!r}, instance {process.get('instance')!r}"
        except (OSError, ValueError, AttributeError):
            pass  # it answers, and that is enough to refuse: what it says only adds detail
        return SocketHolder(pid, holder)


def refuse_if_in_use(path: Path) -> None:
    """Raise ``AdminSocketInUse`` when a live process answers on ``path`` (blocking, bounded; see ``holder_of``)."""
    holder = holder_of(path)
    if holder is not None:
        raise AdminSocketInUse(str(path), holder.pid, holder.holder)


def _lock_socket(path: Path) -> int:
    """Take ``<path>.lock`` (exclusive ``flock``, not waiting) and return its descriptor, or raise
    ``AdminSocketInUse`` when another process holds it (naming it when it already answers on the socket)."""
    fd = open_private(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = holder_of(path)
        raise AdminSocketInUse(str(path), *((holder.pid, holder.holder) if holder else (None, "starting"))) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


@attrs.define
class AdminSocketCounts:
    """What the socket accepted and refused, by reason (for status and tests)."""

    accepted: int = 0
    refused: dict[str, int] = attrs.field(factory=dict)


def peer_refusal(peer: Peer, own_uid: int, *, started_by_daemon: bool) -> tuple[str, str] | None:
    """Why ``peer`` may not act through the admin socket (``(reason, message)``), or None: it may.

    Only the daemon's own uid or root; never a process the daemon started (``started_by_daemon``: a provider
    plugin runs as the daemon's user); and a peer whose uid cannot be read is refused (nothing to decide on)."""
    if peer.uid is None:
        return "unknown_peer", "the peer's uid cannot be read on this platform (SO_PEERCRED)"
    if peer.uid not in (own_uid, 0):
        return "foreign_uid", f"uid {peer.uid} may not use this socket (only uid {own_uid} and root)"
    if started_by_daemon:
        return "daemon_child", f"process {peer.pid} was started by the daemon (a provider plugin?): refused"
    return None


def prepare_socket_dir(path: Path) -> None:
    """Create the admin socket's directory (0700, whatever the umask) and check it: ``InsecurePath`` when another
    user could change what is in it. Called once at start, before the daemon does anything else."""
    make_private_dir(path.parent)
    check_private_dir(path.parent)


async def serve_admin_socket(
    path: Path,
    status: Callable[[], dict[str, Any]],
    commands: Mapping[str, Command] | None = None,
    *,
    counts: AdminSocketCounts | None = None,
    refusals: RefusalNotes | None = None,
    prepare: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``path`` until cancelled; removes a stale socket file first and the socket file on exit. Raises
    ``InsecurePath`` (before serving) on a directory another user could change, and ``AdminSocketInUse`` when
    another live process serves ``path`` (its socket is left alone).
    ``refusals.note(code, message)`` hears every request the socket itself refuses (``daemon.admin_guard``'s
    ``AdminRefusals``, given here: the daemon logs and counts them); each such reply names its ``refused`` code.
    ``prepare`` is awaited before each ``status`` is read (the daemon's: its status pass, off the loop when large)."""
    commands = dict(commands or {})
    counts = AdminSocketCounts() if counts is None else counts
    own_uid = os.geteuid()

    def refuse(code: str, message: str, **extra: Any) -> dict[str, Any]:
        if refusals is not None:
            refusals.note(code, message)
        return {"ok": False, "refused": code, "error": message, **extra}

    # A local directory and socket file, once at start and once at exit: not worth a worker thread each.
    prepare_socket_dir(path)
    lock = await trio.to_thread.run_sync(_lock_socket, path)
    try:
        await _serve_locked(path, status, commands, counts, own_uid, refuse, prepare, task_status)
    finally:
        os.close(lock)


async def _serve_locked(
    path: Path,
    status: Callable[[], dict[str, Any]],
    commands: Mapping[str, Command],
    counts: AdminSocketCounts,
    own_uid: int,
    refuse: Callable[..., dict[str, Any]],
    prepare: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[None],
) -> None:
    holder = await trio.to_thread.run_sync(holder_of, path)
    if holder is not None:  # a daemon that does not take the lock (an older one) still answers there
        raise AdminSocketInUse(str(path), holder.pid, holder.holder)
    if path.is_socket():  # noqa: ASYNC240 - stale: nothing answers on it
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
                peer = _peer(stream)
                refusal = peer_refusal(peer, own_uid, started_by_daemon=_started_by_us(peer.pid))
                refused = None if refusal is None else _refuse(peer, refusal, counts)  # logged and counted at once
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
                    # A refused peer's request is read (and never parsed) before the refusal is sent: closing a unix
                    # socket with unread data resets it, and the client would lose the reason.
                    if refused is not None:
                        reply = refused
                    elif line is None:
                        reply = refuse("no_request", f"no request line within {CLIENT_TIMEOUT:g}s")
                    else:
                        counts.accepted += 1
                        reply = await _answer(line, status, commands, peer.uid, refuse, prepare)
                        log.info("admin socket: request from uid %s pid %s: ok=%s", peer.uid, peer.pid, reply.get("ok"))
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


def _refuse(peer: Peer, refusal: tuple[str, str], counts: AdminSocketCounts) -> dict[str, Any]:
    reason, message = refusal
    counts.refused[reason] = counts.refused.get(reason, 0) + 1
    log.warning(
        "admin socket: refused uid %s pid %s (%s): %s; refused so far: %d",
        peer.uid,
        peer.pid,
        reason,
        message,
        sum(counts.refused.values()),
    )
    return {"ok": False, "refused": reason, "error": f"refused: {message}"}


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
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    if len(line) > MAX_REQUEST:
        return refuse("too_large", f"request too large (more than {MAX_REQUEST} bytes)")
    try:
        request = json.loads(line or b"null")
    except (ValueError, RecursionError):  # RecursionError: 4 KiB of nested brackets
        return refuse("not_json", "request is not JSON")
    cmd = request.get("cmd") if isinstance(request, dict) else None
    if cmd == "status":
        if prepare is not None:
            await prepare()
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


def _peer(stream: trio.SocketStream) -> Peer:
    """The connecting process (Linux ``SO_PEERCRED``); its fields are None where they cannot be had."""
    return _peer_of_socket(stream.socket)


def _peer_of_socket(sock: Any) -> Peer:
    """The process at the other end of a connected unix socket (for a client: the one that listens)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return Peer(None, None)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", raw)
    except (OSError, struct.error):
        return Peer(None, None)
    return Peer(pid, uid)


_MAX_ANCESTRY = 256  # parent links followed at most (a pid chain is short; /proc could change under us)


def _started_by_us(pid: int | None, *, me: int | None = None) -> bool:
    """Whether process ``pid`` descends from this one (Linux ``/proc``; False where it cannot be read). The daemon
    itself (a test asking its own socket) is not its own descendant."""
    me = os.getpid() if me is None else me
    if pid is None or pid == me:
        return False
    for _ in range(_MAX_ANCESTRY):
        parent = _parent_of(pid)
        if parent is None or parent <= 1:
            return False
        if parent == me:
            return True
        pid = parent
    return False


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and parentheses
        return int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


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
