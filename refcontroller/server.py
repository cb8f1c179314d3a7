"""The controller's connection handling, independent of sockets: give it any trio ``Stream`` and a replica index.

``ControllerServer.handle_stream`` runs one connection to its end and never raises: a peer that breaks the
protocol, fails TLS or goes silent is dropped, and every other peer keeps being served. Time comes from trio
(``trio.current_time()``), so a simulation can run the server on in-memory streams and ``MockClock``.

The join (the first frame of every connection), in order:

0. The caps of ``gate.py``: over ``max_connections`` the connection is closed at once, before TLS; over
   ``max_per_address`` unauthenticated ones from its address, the oldest of those is closed to make room. A
   connection whose handshake succeeds moves to its address's authenticated budget.
1. For a TLS stream, the handshake (within ``timeouts.handshake``) and the role from the peer's certificate. A
   stream that is not TLS must be given its ``role`` (in-memory tests and simulations).
2. The first frame must be complete within ``timeouts.join``. Its kind is read before its body: one that is not
   ``Join`` gets ``ErrorMsg{not_joined}`` undecoded. Then the Join is decoded; another protocol version gets
   ``ErrorMsg{version_mismatch}``; a ``Join.role`` other than the certificate's (or the controller role) gets
   ``ErrorMsg{not_allowed}``. The connection is then closed.
3. A standby answers ``JoinReply(accepted=False, primary=False, redirect=<primary host:port>)`` and closes.
4. A worker is admitted by its single-use token, exchanged for its own credential (``JoinReply.credential``), or
   on a later join by that credential (``workers.py``, ``credentials.py``), or gets ``ErrorMsg{token_invalid}``; a
   provisioner must name itself (``identity``, and ``instance``: its process start, see ``leases.holder_key``)
   and its providers. A bad name is refused with ``JoinReply(accepted=False, reason=...)``.
5. ``JoinReply(accepted=True, term, primary=True, controller_id="replica-<i>", incarnation, last_index)`` (the
   store's incarnation and its last fact index), then the session (``session.py``).

Every refusal is logged and counted by ``gate.Gate.refuse`` (reason, peer, role) and shown in ``status``.

When a worker's connection ends, its host becomes ``lost`` one heartbeat timeout later unless it rejoined with its
credential meanwhile; a lost host's credential is revoked in the store, so it cannot come back, not even after a
restart. On failover every session of the old primary is disconnected so its clients rejoin.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from provisionerd.domain.errors import AuthError, BuffersExhausted, FrameOverBounds, ProtocolError
from provisionerd.domain.model import PROTOCOL_VERSION, HostState, Role
from provisionerd.wire.framing import DEFAULT_MAX_FRAME, FramedStream
from provisionerd.wire.messages import ErrorMsg, Join, JoinReply
from provisionerd.wire.tls import peer_role, server_handshake
from refcontroller import workers
from refcontroller.cluster import Cluster
from refcontroller.commits import Rejection
from refcontroller.credentials import is_credential, new_credential
from refcontroller.credentials_address import AddressBoundJoin
from refcontroller.gate import Gate, Peer, Ticket, peer_address
from refcontroller.leases import instance_problem
from refcontroller.rules import RULES
from refcontroller.session import PEER_ERRORS, Session
from refcontroller.store_tx import StoreFailure
from refcontroller.workers import SECRET_REFUSALS

log = logging.getLogger(__name__)

MAX_PROVIDERS = 1000
MAX_NAME = 256


@attrs.frozen
class Timeouts:
    """Seconds. ``heartbeat``: silence after which a peer is dropped, and the time from a worker's disconnect to
    its host becoming ``lost``; ``handshake``: the TLS handshake; ``join``: from the handshake to a complete
    first frame (the pre-join idle timeout); ``send``: one write to a peer that does not read (it is dropped)."""

    heartbeat: float = 15.0
    handshake: float = 10.0
    send: float = 15.0
    join: float = 10.0


@attrs.define(eq=False)
class ControllerServer:
    """All replicas' connections over one ``Cluster``. ``stats`` counts drops and refusals (shown in status)."""

    cluster: Cluster
    timeouts: Timeouts = Timeouts()
    max_frame: int = DEFAULT_MAX_FRAME
    wall_clock: Callable[[], float] = time.time
    sessions: set[Session] = attrs.field(factory=set)
    stats: collections.Counter[str] = attrs.field(factory=collections.Counter)
    gate: Gate = attrs.field(factory=Gate)
    #: The opt-in address-bound join (``credentials_address``); ``None``: off (every such Join is refused).
    address_bound: AddressBoundJoin | None = None
    _nursery: trio.Nursery | None = None
    _watched: set[str] = attrs.field(factory=set, init=False)  # providers whose lease expiry is watched

    @property
    def heartbeat_timeout(self) -> float:
        return self.timeouts.heartbeat

    @property
    def send_timeout(self) -> float:
        return self.timeouts.send

    # --- connections ------------------------------------------------------------------------------------------

    async def handle_stream(self, stream: trio.abc.Stream, replica: int, role: Role | None = None) -> None:
        """Serve one connection on ``replica`` until it ends; closes ``stream``. Never raises peer errors.

        ``role`` is for streams without TLS (in-memory tests, simulations); a TLS stream's role is its certificate's.
        """
        if role is None and not isinstance(stream, trio.SSLStream):
            raise TypeError("a stream without TLS must be given the peer's role")
        address = peer_address(stream)
        framed = FramedStream(stream, self.max_frame, pool=self.gate.pool, budget=self.gate.budget())
        try:
            with self.gate.admit(address) as ticket:
                if ticket is not None:
                    with ticket.scope:  # cancelled when the gate evicts it (an unauthenticated connection)
                        await self._serve(framed, replica, role, Peer(address, role.value if role else ""), ticket)
        except Exception:
            log.exception("internal error on replica %s", replica)
            self.stats["internal_errors"] += 1
        finally:
            framed.release()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _serve(self, framed: FramedStream, replica: int, role: Role | None, peer: Peer, ticket: Ticket) -> None:
        try:
            session = await self._join(framed, replica, role, peer, ticket)
            if session is not None:
                self.sessions.add(session)
                try:
                    await session.run()
                finally:
                    self.sessions.discard(session)
                    if session.role is Role.WORKER:
                        self._start_lost_timer(session.join.instance_ref)
        except (*PEER_ERRORS, AuthError) as exc:
            # Before the join: a failed TLS handshake (no or foreign certificate), a certificate without a role, a
            # garbage first frame, or a peer too slow to join. (A joined session handles its own errors.)
            reason = self.refusal_reason(exc)
            if reason == "disconnected":  # the peer left: nothing was refused
                log.info("peer left before its join replica=%s peer=%s: %r", replica, peer.address, exc)
            else:
                self.gate.refuse(reason, peer.address, peer.role, repr(exc))
            self.stats["peers_dropped"] += 1
            if isinstance(exc, ProtocolError):
                await self.send_error_and_close(framed, "bad_frame", str(exc))

    @staticmethod
    def refusal_reason(exc: BaseException) -> str:
        if isinstance(exc, FrameOverBounds):
            return "over_bounds"
        if isinstance(exc, BuffersExhausted):
            return "buffers_exhausted"
        if isinstance(exc, ProtocolError):
            return "bad_frame"
        if isinstance(exc, AuthError):
            return "no_role"
        if isinstance(exc, trio.TooSlowError):
            return "join_timeout"
        return "disconnected"

    async def _join(
        self, framed: FramedStream, replica: int, role: Role | None, peer: Peer, ticket: Ticket
    ) -> Session | None:
        address = peer.address
        if role is None:
            assert isinstance(framed.stream, trio.SSLStream)
            with trio.move_on_after(self.timeouts.handshake) as slow:
                try:
                    await server_handshake(framed.stream)
                except trio.BrokenResourceError as exc:  # no, a foreign or an expired certificate; a dead peer
                    self.gate.refuse("handshake", address, "", f"TLS handshake failed: {exc.__cause__!r}")
                    self.stats["peers_dropped"] += 1
                    return None
            if slow.cancelled_caught:
                self.gate.refuse("handshake", address, "", f"no TLS handshake within {self.timeouts.handshake}s")
                return None
            role = peer_role(framed.stream)
            peer.role = role.value
        # A valid certificate of this cluster (or a stream given its role): the address's authenticated budget.
        if not self.gate.authenticate(ticket, role.value):
            return None
        with trio.fail_after(self.timeouts.join):
            head = await framed.receive_head()
            if head is None:
                return None
            if head.kind is not Join:  # refused on its kind: the rest of it is neither read nor decoded
                self.gate.refuse("not_joined", address, role.value, f"first frame is {head.member}")
                await self.send_error_and_close(framed, "not_joined", "the first frame must be Join", head.corr)
                return None
            body = await framed.receive_body()
        assert body is not None  # its head was there
        envelope = await framed.decode(body)
        join, corr = envelope.msg, envelope.corr
        assert isinstance(join, Join), join  # its kind was read above
        cluster = self.cluster
        if join.protocol_version != PROTOCOL_VERSION:
            self.gate.refuse("version_mismatch", address, role.value, f"peer speaks {join.protocol_version}")
            await self.send_error_and_close(
                framed,
                "version_mismatch",
                f"controller speaks {PROTOCOL_VERSION}, peer {join.protocol_version}",
                corr,
            )
            return None
        if (join.role is not role or role is Role.CONTROLLER) and RULES.role_allowlist:
            self.stats["not_allowed"] += 1
            self.gate.refuse("not_allowed", address, role.value, f"Join role {join.role.value}")
            await self.send_error_and_close(
                framed, "not_allowed", f"Join role {join.role.value!r} but certificate role {role.value!r}", corr
            )
            return None
        if not cluster.is_primary(replica) and RULES.redirect_non_primary:
            await self._send_quietly(
                framed,
                JoinReply(
                    accepted=False,
                    term=cluster.term,
                    primary=False,
                    redirect=cluster.replicas.primary_address,
                    controller_id=f"replica-{replica}",
                    reason="not_primary",
                ),
                corr,
            )
            return None
        # A worker's first join (or the exchange of a rejoin proof) gets its own credential in the reply.
        issued = "" if role is not Role.WORKER or is_credential(join.token) else new_credential()
        try:
            refusal = self._admit(join, replica, issued, address)
        except StoreFailure as exc:  # a row read for this join fails its checksum (store_rows): typed, not a bug
            fault = cluster.storage_fault("Join", exc)
            self.gate.refuse(fault.reason, address, role.value, fault.detail)
            reply = JoinReply(accepted=False, term=cluster.term, primary=True, reason=f"{fault.reason}: {fault.detail}")
            await self._send_quietly(framed, reply, corr)
            return None
        if isinstance(refusal, HostState):  # a worker: its session is its instance's (named by an address-bound join)
            join, paired, refusal = attrs.evolve(join, instance_ref=refusal.instance_ref), refusal.instance_ref, None
        else:
            paired = ""
        if refusal is not None:
            reason = refusal.reason if refusal.reason in SECRET_REFUSALS else "join_refused"
            self.gate.refuse(reason, address, role.value, f"identity={join.identity[:64]!r}: {refusal.detail}")
        if refusal is not None and refusal.reason in SECRET_REFUSALS:
            await self.send_error_and_close(framed, "token_invalid", refusal.detail, corr)
            return None
        if refusal is not None:
            reply = JoinReply(accepted=False, term=cluster.term, primary=True, reason=refusal.detail)
            await self._send_quietly(framed, reply, corr)
            return None
        if role is Role.WORKER:  # a rejoin replaces whatever connection the same instance still has
            for other in [
                s for s in self.sessions if s.role is Role.WORKER and s.join.instance_ref == join.instance_ref
            ]:
                other.disconnect()
        session = Session(self, framed, replica, role, join, address, undelivered=bool(issued))
        accepted = JoinReply(
            accepted=True,
            term=cluster.term,
            primary=True,
            controller_id=f"replica-{replica}",
            incarnation=cluster.store.incarnation,
            last_index=cluster.store.last_index(),
            credential=issued,
            instance_ref=paired if join.machine_id else "",
            drains=True,
            history=True,
        )
        await session.send(accepted, corr)
        return session

    def _admit(self, join: Join, replica: int, credential: str = "", address: str = "") -> Rejection | HostState | None:
        """``None``: admitted (not a worker); a worker's admission gives its host."""
        bad_identity = not join.identity or len(join.identity) > MAX_NAME
        # Before a worker's secret is looked at, so a refused Join never spends a token (protocol §7).
        if bad_identity and (RULES.join_checks or join.role is not Role.WORKER):
            return Rejection("invalid", f"identity must be 1..{MAX_NAME} characters")
        if join.role is Role.PROVISIONER:
            if len(join.providers) > MAX_PROVIDERS or not all(0 < len(p) <= MAX_NAME for p in join.providers):
                return Rejection("invalid", f"at most {MAX_PROVIDERS} provider names of 1..{MAX_NAME} characters")
            problem = instance_problem(join.identity, join.instance)
            if problem is not None:
                return Rejection("invalid", problem)
        if join.role is Role.WORKER:
            if join.machine_id and not join.instance_ref:  # the opt-in address-bound join (credentials_address)
                live_refs = frozenset(s.join.instance_ref for s in self.sessions if s.role is Role.WORKER)
                admitted = self.cluster.admit_by_address(
                    replica,
                    (join.machine_id, join.token),
                    address,
                    self.address_bound,
                    self.wall_clock(),
                    credential,
                    live_refs,
                )
            else:
                live = any(s.role is Role.WORKER and s.join.instance_ref == join.instance_ref for s in self.sessions)
                admitted = self.cluster.admit_worker(
                    replica, join.instance_ref, join.token, self.wall_clock(), credential=credential or None, live=live
                )
            if isinstance(admitted, Rejection):
                log.warning(
                    "worker refused instance_ref=%r machine_id=%r: %s",
                    join.instance_ref,
                    join.machine_id[:256],
                    admitted.detail,
                )
                self.stats["workers_refused"] += 1
                return admitted
            if bad_identity:  # only with the join_checks rule off (a test hook): the token was judged first
                return Rejection("invalid", f"identity must be 1..{MAX_NAME} characters")
            report, dropped = workers.reported_capabilities(join.capabilities)
            if dropped:
                log.warning("worker %r: %d capability entries dropped (bounds)", admitted.instance_ref, dropped)
                self.stats["capabilities_dropped"] += dropped
            admitted = self.cluster.hosts.report(admitted.instance_ref, report) or admitted
            self.broadcast_host(admitted)
            return admitted
        return None

    async def send_error_and_close(self, framed: FramedStream, code: str, message: str, corr: int = 0) -> None:
        """Best effort: tell the peer why (echoing the offending request's ``corr``), then close.

        A peer that does not take the error within the send timeout is closed anyway.
        """
        await self._send_quietly(framed, ErrorMsg(code, message[:1000]), corr)
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(framed.stream)

    async def _send_quietly(self, framed: FramedStream, msg: Any, corr: int) -> None:
        with trio.move_on_after(self.timeouts.send):
            try:
                await framed.send(msg, corr)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass

    # --- fan-out ----------------------------------------------------------------------------------------------

    def broadcast_demand(self) -> None:
        for session in self.sessions:
            session.notify_demand()

    def broadcast_host(self, host: HostState) -> None:
        for session in self.sessions:
            session.notify_host(host)

    def disconnect_replica(self, replica: int) -> None:
        for session in list(self.sessions):
            if session.replica == replica:
                session.disconnect()

    def lease_freed(self, provider: str) -> None:
        """``provider``'s lease ended (released, or expired unrenewed): tell every connection that was denied it as
        ``held`` (``LeaseFreed``), so a standby acquires at once, within the rules (grace, quorum) of its request."""
        if self.cluster.leases.live(provider, trio.current_time()) is not None:
            return  # a released lease already granted again (nothing freed): the waiters stay waiting
        for session in self.sessions:
            session.notify_freed(provider)

    def watch_expiry(self, provider: str) -> None:
        """Push ``LeaseFreed`` when ``provider``'s live lease expires unrenewed (one watcher per provider)."""
        if self._nursery is not None and provider not in self._watched:
            self._watched.add(provider)
            self._nursery.start_soon(self._watch_expiry, provider)

    async def _watch_expiry(self, provider: str) -> None:
        try:
            # Sleeps to a deadline a renewal may move (looked up again on waking): no event to wait on.
            while (lease := self.cluster.leases.live(provider, trio.current_time())) is not None:  # noqa: ASYNC110
                await trio.sleep_until(lease.expires_at)
        finally:
            self._watched.discard(provider)
        self.lease_freed(provider)

    def _start_lost_timer(self, instance_ref: str) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._mark_lost_later, instance_ref)

    async def _mark_lost_later(self, instance_ref: str) -> None:
        await trio.sleep(self.timeouts.heartbeat)
        if any(s.role is Role.WORKER and s.join.instance_ref == instance_ref for s in self.sessions):
            return  # it rejoined meanwhile
        host = self.cluster.worker_lost(instance_ref, self.wall_clock())
        if host is not None:
            log.info("host lost instance_ref=%r", instance_ref)
            self.broadcast_host(host)

    def status(self) -> dict[str, Any]:
        document = self.cluster.status(trio.current_time())
        document["sessions"] = sorted(
            (s.describe() for s in self.sessions), key=lambda d: (d["replica"], d["role"], d["identity"])
        )
        document["stats"] = dict(sorted(self.stats.items()))
        document["gate"] = self.gate.status()
        return document


@asynccontextmanager
async def open_controller_server(cluster: Cluster, **options: Any) -> AsyncIterator[ControllerServer]:
    """A ``ControllerServer`` with a nursery for its background timers; closed (timers cancelled) on exit.

    Connections are handed to it by the caller (``serve_listeners`` in ``listeners.py``, or a test's in-memory
    streams): ``nursery.start_soon(server.handle_stream, stream, replica)``.
    """
    server = ControllerServer(cluster, **options)
    async with trio.open_nursery() as nursery:
        server._nursery = nursery
        try:
            yield server
        finally:
            server._nursery = None
            nursery.cancel_scope.cancel()
