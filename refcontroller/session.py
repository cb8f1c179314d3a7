"""One joined client connection: a reader that answers requests and, for provisioners, a pusher.

The reader enforces the per-role allowlist on every frame (``ErrorMsg{not_allowed}`` and close), drops a peer that
stays silent for the heartbeat timeout, and answers requests in order with the request's ``corr``.

A resync is planned and sent by a task of its own: the plan's pages are fixed a chunk of facts at a time
(``cluster.ResyncPlanner``, a checkpoint after each), then sent page by page (each page read from the store just
before it is sent and decoded ``cluster.DECODE_STEP`` facts per task step, the frame lock taken per frame): the
reader goes on answering heartbeats, lease renewals and commits while it plans, between its pages and within
them. Before each page the socket must have drained to ``pacing.LOW_WATER`` unsent bytes, so a reply written
between two pages waits behind at most one page and the peer's receive window, not behind every page the kernel
would buffer (``refcontroller/pacing.py``).

The pusher sends what changed since the last push: host states (coalesced per instance, latest wins) of the
providers this provisioner declared, and the demand snapshot when its ``seq`` moved, or when forced (after the join
and after a resync). A resync holds ``push_lock`` from taking its snapshot until its last page is sent, so every
push that follows it is newer than the resync, and the pages of one demand snapshot go in one write.

Any send that takes longer than the send timeout (a peer that does not read) drops the peer: memory per peer stays
bounded by one demand snapshot plus one pending state per host.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from provisionerd.domain.errors import FrameTooLarge, ProtocolError
from provisionerd.domain.model import CommittedFact, HostState, Role
from provisionerd.wire.codec import encode
from provisionerd.wire.framing import FramedStream, frame_bytes
from provisionerd.wire.messages import (
    Ack,
    AdminFailover,
    AdminQuorum,
    AdminReply,
    AdminSetDemand,
    AdminStatus,
    Heartbeat,
    HeartbeatAck,
    HistoryQuery,
    Join,
    LeaseDenied,
    LeaseFreed,
    LeaseGrant,
    LeaseRelease,
    Message,
    Rejected,
    ResyncPage,
    ResyncRequest,
    WorkerStatus,
)
from provisionerd.wire.paging import HOSTS_PAGE_ITEMS, demand_pages, host_pushes, paginate_by_size
from provisionerd.wire.roles import ALLOWED
from refcontroller import history, workers
from refcontroller.commits import INVALID
from refcontroller.leases import holder_key
from refcontroller.pacing import until_drained
from refcontroller.replies import provisioner_reply, worker_status_valid
from refcontroller.rules import RULES
from refcontroller.store_tx import StoreFailure

if TYPE_CHECKING:
    from refcontroller.server import ControllerServer

log = logging.getLogger(__name__)

#: Errors that mean "this peer is gone or misbehaved": drop it, keep serving everyone else.
PEER_ERRORS = (ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


@attrs.define(eq=False)
class Session:
    server: ControllerServer
    framed: FramedStream
    replica: int
    role: Role
    join: Join
    address: str = "memory"
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    push_lock: trio.Lock = attrs.field(factory=trio.Lock)
    changed: trio.Event = attrs.field(factory=trio.Event)
    force_demand: bool = True  # a snapshot follows every join
    demand_sent: int = -1
    pending_hosts: dict[str, HostState] = attrs.field(factory=dict)
    #: Host-state changes queued for this connection so far (the digest's and HostStatePush's ``seq``).
    host_seq: int = 0
    #: Providers this connection was denied as ``held`` since its last grant of them: told ``LeaseFreed`` when the
    #: lease ends (``ControllerServer.lease_freed``), so a standby acquires at once instead of at ``retryAfter``.
    waiting: set[str] = attrs.field(factory=set)
    #: A worker whose JoinReply carried a new credential: its first frame after it proves the credential arrived
    #: (``ClusterState.credential_delivered``); until then its token may be presented again (``store_credentials``).
    undelivered: bool = False
    pending_freed: set[str] = attrs.field(factory=set)
    _tasks: trio.Nursery | None = attrs.field(default=None, init=False)

    @property
    def identity(self) -> str:
        return self.join.identity

    @property
    def holder(self) -> str:
        """This connection's lease holder key (``identity#instance``): the same for every rejoin of one process."""
        return holder_key(self.join.identity, self.join.instance)

    @property
    def providers(self) -> frozenset[str]:
        return frozenset(self.join.providers)

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"replica": self.replica, "role": self.role.value, "identity": self.identity}
        if self.join.instance:
            described["instance"] = self.join.instance
        return described

    # --- what the server tells a session ----------------------------------------------------------------------

    def notify_demand(self) -> None:
        self.changed.set()

    def notify_host(self, host: HostState) -> None:
        if self.role is Role.PROVISIONER and host.provider in self.providers:
            self.pending_hosts[host.instance_ref] = host
            self.host_seq += 1
            self.changed.set()

    def notify_freed(self, provider: str) -> None:
        if provider in self.waiting:
            self.waiting.discard(provider)
            self.pending_freed.add(provider)
            self.changed.set()

    def disconnect(self) -> None:
        self.cancel_scope.cancel()

    # --- tasks ------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the peer leaves, misbehaves, or the server disconnects it. Never raises peer errors."""
        with self.cancel_scope:
            async with trio.open_nursery() as nursery:
                self._tasks = nursery
                if self.role is Role.PROVISIONER:
                    nursery.start_soon(self._guarded, self._push_loop, "push")
                await self._guarded(self._read_loop, "read")
                nursery.cancel_scope.cancel()

    async def _guarded(self, loop: Callable[[], Awaitable[None]], name: str, *, ends: bool = True) -> None:
        """Run ``loop``; a peer error drops the peer. ``ends``: the session ends with the loop, however it ends."""
        try:
            await loop()
            if not ends:
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The peer went away without a clean close (no TLS close_notify, a reset): a disconnect, not a fault.
            if not self.cancel_scope.cancel_called:
                log.info(
                    "peer disconnected replica=%s role=%s identity=%r: %r",
                    self.replica,
                    self.role.value,
                    self.identity,
                    exc,
                )
                self.server.stats["disconnects"] += 1
        except PEER_ERRORS as exc:
            if self.cancel_scope.cancel_called:
                return  # the other loop already dropped this peer
            log.info(
                "peer dropped replica=%s role=%s identity=%r in=%s: %r",
                self.replica,
                self.role.value,
                self.identity,
                name,
                exc,
            )
            self.server.stats["peers_dropped"] += 1
            if isinstance(exc, ProtocolError):
                reason = self.server.refusal_reason(exc)
                self.server.gate.refuse(reason, self.address, self.role.value, f"identity={self.identity!r}: {exc}")
                await self.server.send_error_and_close(self.framed, "bad_frame", str(exc))
        except Exception:
            # A bug in this reference controller: keep serving the other peers, and count it so tests notice.
            log.exception("internal error replica=%s role=%s", self.replica, self.role.value)
            self.server.stats["internal_errors"] += 1
        self.cancel_scope.cancel()

    def _framed_bytes(self, msg: Message, corr: int) -> bytes:
        """``msg`` encoded and framed as ``FramedStream.send`` frames it (``FrameTooLarge``: nothing is sent)."""
        body = encode(msg, corr)
        if len(body) > self.framed.max_frame:
            raise FrameTooLarge(len(body), self.framed.max_frame)
        return frame_bytes(body)

    async def send(self, msg: Message, corr: int) -> None:
        with trio.fail_after(self.server.send_timeout):
            await self.framed.send(msg, corr)

    async def _read_loop(self) -> None:
        server = self.server
        while True:
            body = None
            with trio.move_on_after(server.heartbeat_timeout) as silent:
                head = await self.framed.receive_head()
                if head is not None and (head.kind in ALLOWED[self.role] or not RULES.role_allowlist):
                    body = await self.framed.receive_body()
            if silent.cancelled_caught:
                log.info(
                    "peer silent for %ss replica=%s identity=%r", server.heartbeat_timeout, self.replica, self.identity
                )
                return
            if head is None:
                return
            if body is None:  # refused on its kind: the rest of it is neither read nor decoded
                server.stats["not_allowed"] += 1
                server.gate.refuse(
                    "not_allowed", self.address, self.role.value, f"{head.member} from identity={self.identity!r}"
                )
                await server.send_error_and_close(
                    self.framed, "not_allowed", f"role {self.role.value} may not send {head.member}", head.corr
                )
                return
            envelope = await self.framed.decode(body)
            if self.undelivered:
                self._delivered()
            try:
                await self._answer(envelope.msg, envelope.corr)
            except StoreFailure as exc:  # a read met a row that fails its checksum: typed, the link kept
                await self._storage_fault(type(envelope.msg).__name__, exc, envelope.corr)

    async def _storage_fault(self, what: str, exc: StoreFailure, corr: int) -> None:
        fault = self.server.cluster.storage_fault(what, exc)
        await self.send(Rejected(fault.reason, fault.detail[:1000]), corr)

    def _delivered(self) -> None:
        # Marked once; a store failure leaves it to the worker's next frame.
        self.undelivered = not self.server.cluster.credential_delivered(
            self.join.instance_ref, self.server.wall_clock()
        )

    async def _answer(self, msg: Message, corr: int) -> None:
        server, cluster = self.server, self.server.cluster
        now, wall = trio.current_time(), server.wall_clock()
        match msg:
            case Join():
                await self.send(Rejected(INVALID, "already joined"), corr)
            case Heartbeat(seq=seq):
                digest = (0, 0, 0)
                if self.role is Role.PROVISIONER:
                    digest = (cluster.store.last_index_of(self.providers), cluster.demand.seq, self.host_seq)
                await self.send(HeartbeatAck(seq, cluster.term, *digest), corr)
            case ResyncRequest():
                # From a task of its own: heartbeats, lease renewals and commits are answered between its pages.
                assert self._tasks is not None
                resync = functools.partial(self._resync, msg, corr)
                self._tasks.start_soon(functools.partial(self._guarded, resync, "resync", ends=False))
            case WorkerStatus(status=status, reclaim_at=reclaim_at, rebalance_at=rebalance_at):
                probed_at, reported = msg.probed_at, msg.capabilities
                if not worker_status_valid(status, reclaim_at, rebalance_at, probed_at, probed=bool(reported)):
                    await self.send(
                        Rejected(INVALID, "a worker reports idle or busy, times >= 0, a re-probe with its time"), corr
                    )
                    return
                probed = None
                if reported:  # a re-probe after the join (§6.4 "Health after join"), bounded as the join's report
                    report, dropped = workers.reported_capabilities(reported)
                    if dropped:
                        log.warning("worker %r: %d re-probed entries dropped (bounds)", self.join.instance_ref, dropped)
                        server.stats["capabilities_dropped"] += dropped
                    probed = cluster.worker_probed(self.join.instance_ref, report, probed_at)
                host = cluster.worker_status(self.join.instance_ref, status, wall, reclaim_at, rebalance_at)
                if (host := host or probed) is not None:  # one push carries both changes
                    server.broadcast_host(host)
                await self.send(Ack(), corr)
            case AdminSetDemand(items=items, licenses=licenses):
                try:
                    snapshot = cluster.set_demand(items, licenses)
                except ValueError as exc:
                    await self.send(_admin(False, error=str(exc)), corr)
                    return
                if snapshot is not None:
                    server.broadcast_demand()
                await self.send(_admin(True, seq=cluster.demand.seq, changed=snapshot is not None), corr)
            case AdminFailover(target=target):
                old = cluster.replicas.primary
                try:
                    new = cluster.fail_over(now, None if target < 0 else target)
                except ValueError as exc:
                    await self.send(_admin(False, error=str(exc)), corr)
                    return
                await self.send(_admin(True, primary=new, term=cluster.term, previous=old), corr)
                server.disconnect_replica(old)  # this admin connection included: everyone rejoins
            case AdminQuorum(fresh=fresh):
                cluster.set_quorum(fresh)
                await self.send(_admin(True, quorum_fresh=fresh), corr)
            case HistoryQuery():  # one bounded page (refcontroller.history), answered in order like the rest
                page = history.answer(cluster.store, msg, self.role, self.providers)
                if isinstance(page, Rejected):
                    server.stats["history_refused"] += 1
                    log.info(
                        "history query refused identity=%r role=%s: %s", self.identity, self.role.value, page.detail
                    )
                await self.send(page, corr)
            case AdminStatus():
                await self.send(AdminReply(True, json.dumps(server.status(), sort_keys=True)), corr)
            case _:
                reply = provisioner_reply(cluster, self.replica, self.holder, self.providers, msg, now, wall)
                for host in cluster.take_host_changes():  # a commit that identified or drained hosts
                    server.broadcast_host(host)
                match reply:
                    case LeaseDenied(provider=provider, reason="held"):
                        self.waiting.add(provider)
                        server.watch_expiry(provider)
                    case LeaseGrant(provider=provider):
                        self.waiting.discard(provider)
                    case Ack() if isinstance(msg, LeaseRelease):
                        server.lease_freed(msg.provider)
                await self.send(reply, corr)

    async def _resync(self, request: ResyncRequest, corr: int) -> None:
        try:
            await self._resync_pages(request, corr)
        except StoreFailure as exc:  # pages already sent are superseded: the daemon asks again
            await self._storage_fault("ResyncRequest", exc, corr)

    async def _resync_pages(self, request: ResyncRequest, corr: int) -> None:
        wanted = frozenset(request.providers) or self.providers
        if not wanted <= self.providers:
            await self.send(Rejected(INVALID, "resync of providers not declared in this connection's Join"), corr)
            return
        cluster = self.server.cluster
        async with self.push_lock:
            planner = cluster.resync_planner(wanted, request.after_index, request.incarnation)
            host_seq = self.host_seq  # with the planner's hosts: what the plan carries is as of now
            while (plan := planner.step()) is None:  # a chunk of facts sized per step: the loop is never held
                await trio.lowlevel.checkpoint()
            host_chunks = (
                paginate_by_size(plan.hosts, lambda c: ResyncPage(0, 1, (), c), HOSTS_PAGE_ITEMS) if plan.hosts else []
            )
            tail = (plan.incremental, plan.as_of, host_seq)
            for host in plan.hosts:  # the resync carries them; a pending older push would only repeat them
                if self.pending_hosts.get(host.instance_ref) == host:
                    del self.pending_hosts[host.instance_ref]
            page_count = max(1, len(plan.fact_ranges) + len(host_chunks))
            page = 0
            for page in range(len(plan.fact_ranges)):
                facts: list[CommittedFact] = []
                for decoded in cluster.resync_facts_in_steps(plan, page):
                    facts += decoded
                    await trio.lowlevel.checkpoint()
                facts = facts if RULES.resync_in_order else facts[::-1]
                # Made (and encoded) while the previous page drains, written once it has: the peer never waits for
                # a page to be made, and a reply never waits behind more than one.
                data = self._framed_bytes(ResyncPage(page, page_count, tuple(facts), (), *tail), corr)
                with trio.fail_after(self.server.send_timeout):  # a peer that stops reading is dropped
                    await until_drained(self.framed.stream)
                    await self.framed.send_raw(data)
            for i, chunk in enumerate(host_chunks):
                await self.send(ResyncPage(len(plan.fact_ranges) + i, page_count, (), chunk, *tail), corr)
            if not plan.fact_ranges and not host_chunks:
                await self.send(ResyncPage(0, 1, (), (), *tail), corr)
            self.force_demand = True
            self.changed.set()

    async def _push_loop(self) -> None:
        cluster = self.server.cluster
        while True:
            async with self.push_lock:
                # Reset first: a change that lands while we send sets the new event and we loop again.
                self.changed = trio.Event()
                hosts = list(self.pending_hosts.values())
                self.pending_hosts.clear()
                frames: list[tuple[Message, int]] = (
                    [(attrs.evolve(push, seq=self.host_seq), 0) for push in host_pushes(hosts)] if hosts else []
                )
                frames += [(LeaseFreed(provider), 0) for provider in sorted(self.pending_freed)]
                self.pending_freed.clear()
                snapshot = cluster.demand
                if self.force_demand or snapshot.seq != self.demand_sent:
                    frames += [
                        (page, 0) for page in demand_pages(snapshot.seq, snapshot.items, licenses=snapshot.licenses)
                    ]
                    self.force_demand, self.demand_sent = False, snapshot.seq
                if frames:
                    with trio.fail_after(self.server.send_timeout):
                        await self.framed.send_many(frames)
            await self.changed.wait()


def _admin(ok: bool, **fields: object) -> AdminReply:
    return AdminReply(ok, json.dumps(fields, sort_keys=True))
