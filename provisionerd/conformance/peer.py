"""The kit's client: one mutual-TLS connection to a controller replica, speaking the project's own wire code.

Frames go through ``wire.framing.FramedStream`` and ``wire.codec``, contexts come from ``wire.tls`` and addresses
are parsed by ``controller.connect.parse_address``, so the kit checks the controller with exactly the bytes the
daemon sends. A ``Peer`` keeps the pushes (``corr = 0``) it reads while it waits for a reply, so a check can look
at them afterwards (``take_pushes``).
"""

from __future__ import annotations

import itertools
import secrets
import ssl
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from provisionerd.conformance.results import CheckFailed, NotRun
from provisionerd.controller.connect import parse_address
from provisionerd.domain.errors import AuthError, ConfigError, ProtocolError
from provisionerd.domain.model import Role
from provisionerd.pki.certs import cert_paths
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import Envelope, ErrorMsg, Heartbeat, Join, JoinReply, Message
from provisionerd.wire.tls import ClusterSSLContext, client_ssl_context, peer_role

#: Redirects followed from one address before giving up.
MAX_REDIRECTS = 3
#: A connection the kit keeps open while it waits (out a grace, say) sends a heartbeat this often: protocol.md §4
#: recommends 5 s, and a controller drops a peer silent for its heartbeat timeout (the reference's: 15 s).
HEARTBEAT_EVERY = 5.0
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


@attrs.define(eq=False)
class Connector:
    """Opens connections with the certificates of ``certs_dir`` (``<role>.pem``/``.key`` and ``ca.pem``)."""

    certs_dir: Path
    timeout: float = 10.0
    _contexts: dict[Role, ClusterSSLContext] = attrs.field(factory=dict)

    def has_role(self, role: Role) -> bool:
        pem, key = cert_paths(self.certs_dir, role.value)
        return pem.is_file() and key.is_file()

    def context(self, role: Role) -> ClusterSSLContext:
        if not self.has_role(role):
            raise NotRun(f"no {role.value}.pem/{role.value}.key in {self.certs_dir}")
        if role not in self._contexts:
            try:
                self._contexts[role] = client_ssl_context(self.certs_dir, role)
            except ConfigError as exc:
                raise NotRun(str(exc)) from None
        return self._contexts[role]

    async def open(self, address: str, role: Role) -> Peer:
        """TCP + TLS to ``address`` with ``role``'s certificate; the peer must present this cluster's controller
        certificate. Raises ``CheckFailed`` when it cannot be reached or is not a controller."""
        ctx = self.context(role)
        host, port = parse_address(address)
        try:
            with trio.fail_after(self.timeout):
                tcp = await trio.open_tcp_stream(host, port)
                stream = trio.SSLStream(tcp, ctx, server_hostname=host)
                try:
                    await stream.do_handshake()
                    if peer_role(stream) is not Role.CONTROLLER:
                        raise CheckFailed(f"{address} did not present a controller certificate")
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, AuthError, ssl.SSLError) as exc:
            raise CheckFailed(f"cannot connect to {address} as {role.value}: {type(exc).__name__}: {exc}") from None
        return Peer(FramedStream(stream), address, role, self.timeout)


@attrs.define(eq=False)
class Peer:
    framed: FramedStream
    address: str
    role: Role
    timeout: float
    pushes: list[Message] = attrs.field(factory=list)
    _corr: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    #: When the kit last sent on this connection, and how long it had been silent before that send.
    _sent_at: float = attrs.field(factory=trio.current_time)
    _silent_before: float = 0.0
    _beats: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    def next_corr(self) -> int:
        return next(self._corr)

    def _sending(self) -> None:
        now = trio.current_time()
        self._silent_before, self._sent_at = now - self._sent_at, now

    async def send(self, msg: Message, corr: int | None = None) -> int:
        corr = self.next_corr() if corr is None else corr
        self._sending()
        await self.framed.send(msg, corr)
        return corr

    async def keep_alive(self, seconds: float) -> None:
        """Wait ``seconds`` with this connection alive: a heartbeat (its ack read, pushes kept) whenever the kit has
        sent nothing for ``HEARTBEAT_EVERY`` seconds, as a daemon waiting for its lease does. ``CheckFailed`` if one
        goes unanswered."""
        deadline = trio.current_time() + seconds
        while (due := self._sent_at + HEARTBEAT_EVERY) < deadline:
            await trio.sleep_until(due)
            await self.request(Heartbeat(next(self._beats)))
        await trio.sleep_until(deadline)

    async def receive(self, timeout: float | None = None) -> Envelope | None:
        """The next frame (``None``: the controller closed). ``CheckFailed`` when none comes within ``timeout``."""
        with trio.move_on_after(self.timeout if timeout is None else timeout) as scope:
            return await self.framed.receive()
        assert scope.cancelled_caught
        raise CheckFailed(f"no frame from {self.address} within {self.timeout if timeout is None else timeout:g}s")

    async def request(self, msg: Message, timeout: float | None = None) -> Message:
        """Send ``msg`` and return the reply with its ``corr``; pushes read meanwhile are kept in ``pushes``."""
        corr = await self.send(msg)
        return await self.reply_to(corr, type(msg).__name__, timeout)

    async def request_many(self, msgs: Sequence[Message], batch: int = 100) -> list[Message]:
        """Send ``msgs`` pipelined, ``batch`` frames per write, and return their replies in order (a controller
        answers one connection's requests in order, so each reply is read in turn)."""
        replies: list[Message] = []
        for start in range(0, len(msgs), batch):
            chunk = [(msg, self.next_corr()) for msg in msgs[start : start + batch]]
            self._sending()
            await self.framed.send_many(chunk)
            for msg, corr in chunk:
                replies.append(await self.reply_to(corr, type(msg).__name__))
        return replies

    async def reply_to(self, corr: int, what: str, timeout: float | None = None) -> Message:
        wait = self.timeout if timeout is None else timeout
        deadline = trio.current_time() + wait
        while True:
            try:
                envelope = await self.receive(max(0.0, deadline - trio.current_time()))
            except CheckFailed:
                raise CheckFailed(
                    f"no answer to {what} within {self.timeout if timeout is None else timeout:g}s"
                ) from None
            except (ProtocolError, *_STREAM_ERRORS) as exc:
                raise CheckFailed(
                    f"the {self.role.value} connection to {self.address} broke while waiting for the answer to"
                    f" {what}: {exc!r}{self._silence()}"
                ) from None
            if envelope is None:
                raise CheckFailed(
                    f"the controller closed the {self.role.value} connection to {self.address} instead of answering"
                    f" {what}{self._silence()}"
                )
            if envelope.corr == corr:
                return envelope.msg
            if envelope.corr == 0:
                self.pushes.append(envelope.msg)
            elif isinstance(envelope.msg, ErrorMsg):
                raise CheckFailed(f"errorMsg {envelope.msg.code} ({envelope.msg.message!r}) instead of an answer")

    def take_pushes(self, kind: type) -> list[Message]:
        taken = [m for m in self.pushes if isinstance(m, kind)]
        self.pushes = [m for m in self.pushes if not isinstance(m, kind)]
        return taken

    async def wait_push(self, kind: type, timeout: float | None = None) -> Message:
        """The next push of ``kind`` (one already kept first)."""
        deadline = trio.current_time() + (self.timeout if timeout is None else timeout)
        while True:
            for i, msg in enumerate(self.pushes):
                if isinstance(msg, kind):
                    return self.pushes.pop(i)
            try:
                envelope = await self.receive(max(0.0, deadline - trio.current_time()))
            except CheckFailed:
                raise CheckFailed(
                    f"no {kind.__name__} push within {self.timeout if timeout is None else timeout:g}s"
                ) from None
            if envelope is None:
                raise CheckFailed(f"the controller closed the connection before a {kind.__name__} push")
            if envelope.corr == 0:
                self.pushes.append(envelope.msg)

    def _silence(self) -> str:
        """Why a connection may have been dropped, when the kit had left it silent long enough for it."""
        if self._silent_before < HEARTBEAT_EVERY * 2:
            return ""
        return (
            f" (the kit had sent nothing on it for {self._silent_before:.1f}s before: a controller drops a peer"
            " silent for its heartbeat timeout)"
        )

    async def closing(self, timeout: float, what: str = "") -> str:
        """Read until the controller closes; what it said on the way (``"errorMsg bad_frame, closed"``).
        ``CheckFailed`` naming the connection (``what``, else its role and address) and the limit when the controller
        keeps it open for ``timeout``."""
        said: list[str] = []
        with trio.move_on_after(timeout):
            while True:
                try:
                    envelope = await self.framed.receive()
                except (ProtocolError, *_STREAM_ERRORS) as exc:
                    return ", ".join([*said, f"closed ({type(exc).__name__})"])
                if envelope is None:
                    return ", ".join([*said, "closed"])
                if isinstance(envelope.msg, ErrorMsg):
                    said.append(f"errorMsg {envelope.msg.code}")
                elif envelope.corr != 0:
                    said.append(f"answered {type(envelope.msg).__name__}")
        which = what or f"the {self.role.value} connection to {self.address}"
        raise CheckFailed(
            ", ".join(
                [*said, f"{which} was still open after {timeout:g}s (the limit: it must close within {timeout:g}s)"]
            )
        )

    async def aclose(self) -> None:
        with trio.move_on_after(1.0):  # a clean TLS close, forceful when the controller is gone
            try:
                await self.framed.stream.aclose()
                return
            except _STREAM_ERRORS:
                pass
        await trio.aclose_forcefully(self.framed.stream)


def new_instance() -> str:
    """A fresh process-start name, as provisionerd makes one (16 hex characters)."""
    return secrets.token_hex(8)


async def join(connector: Connector, address: str, msg: Join, cert: Role | None = None) -> tuple[Peer, Message]:
    """Open with ``cert``'s certificate (default: the Join's role) and send ``msg``; the peer and the controller's
    answer (the caller closes the peer)."""
    peer = await connector.open(address, msg.role if cert is None else cert)
    try:
        reply = await peer.request(msg)
    except BaseException:
        await peer.aclose()
        raise
    return peer, reply


async def join_primary(connector: Connector, addresses: Sequence[str], msg: Join) -> tuple[Peer, JoinReply]:
    """Join the primary, following redirects from standbys; ``CheckFailed`` naming what each address said."""
    said: list[str] = []
    for address in addresses:
        target = address
        for _ in range(MAX_REDIRECTS + 1):
            try:
                peer, reply = await join(connector, target, msg)
            except CheckFailed as exc:
                said.append(f"{target}: {exc}")
                break
            if isinstance(reply, JoinReply) and reply.accepted:
                return peer, reply
            await peer.aclose()
            said.append(f"{target}: {'' if isinstance(reply, JoinReply) else 'refused with '}{describe(reply)}")
            if not (isinstance(reply, JoinReply) and reply.redirect):
                break
            target = reply.redirect
    raise CheckFailed(f"no replica accepted the {msg.role.value}'s Join: " + "; ".join(said))


def describe(msg: Message) -> str:
    """A short text of an answer for a row's evidence (never a token: ``Join`` keeps it out of repr)."""
    if isinstance(msg, ErrorMsg):
        return f"errorMsg {msg.code} ({msg.message[:120]!r})"
    if isinstance(msg, JoinReply):
        if msg.accepted:
            return f"joinReply accepted (term {msg.term}, version {msg.protocol_version})"
        return f"joinReply refused (primary={msg.primary}, redirect={msg.redirect!r}, reason={msg.reason!r})"
    text = repr(msg)
    return text if len(text) <= 200 else text[:200] + "..."
