"""One joined connection to the primary: its writer, reader, heartbeat and resync, and its pending requests.

A ``Link`` lives for one generation. Everything that goes wrong on it calls ``break_(reason)``, which cancels its
tasks; ``run`` then fails every pending request with ``LinkDown`` and returns. Nothing on a link survives it.

The link resyncs when it starts and again, one resync at a time, whenever

- the session wants one (``request_resync``: a lease was granted, and the daemon must plan from facts the controller
  read after the grant, since another holder's facts are never pushed to us);
- no demand snapshot came within ``snapshot_wait`` of a resync (pushes are fire-and-forget: the one after the join
  may be lost, and demand is level-triggered only if we can always get the level again), with the wait doubling up
  to ``refresh_interval``;
- ``refresh_interval`` passed since the last one (a lost *change* push, of demand or hosts, heals within it), as
  long as the controller sends no digest; with one (protocol §6.3) two heartbeat acks in a row whose digest
  disagrees with what we hold ask for one instead ("digest").

A resync is incremental when it can be: it names the last log index our facts are synced to (``synced_to``, also
those of the previous link when the controller is the same incarnation) and, if the controller answers with the
later facts only, they are folded into the facts we hold.

The controller answers every resync with its pages and then a fresh demand snapshot (protocol §6.3). Each resync
builds a new view of the same generation; the link's latest demand carries over (demand seqs continue on a link).

Sends go through one writer task fed by a bounded channel: a requester that is cancelled (say, by a lease lapse)
while its frame is queued or being written cannot leave half a frame on the stream, and frames queued together
go out in one write.
"""

from __future__ import annotations

import gc
import itertools
import logging
from collections.abc import Callable, Mapping

import attrs
import trio

from provisionerd.controller.commit_doubt import CommitDoubt
from provisionerd.controller.pulse import Pulse
from provisionerd.controller.view import ControllerView, DemandAssembler, ResyncCollector
from provisionerd.domain.errors import LinkDown, ProtocolError, describe_error
from provisionerd.domain.model import CommittedFact, DemandSnapshot, Role
from provisionerd.planner.fact_view import FactView
from provisionerd.wire.codec import opcode
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import (
    DemandPage,
    ErrorMsg,
    Heartbeat,
    HeartbeatAck,
    HostStatePush,
    LeaseFreed,
    Message,
    ResyncPage,
    ResyncRequest,
)
from provisionerd.wire.roles import ALLOWED

log = logging.getLogger(__name__)

#: Frames waiting for the writer. A full queue makes requesters wait (backpressure), it never drops.
OUTBOX_SIZE = 256
#: At most this many queued frames are written in one ``send_many``.
BATCH = 64
_LINK_ERRORS = (ProtocolError, LinkDown, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


class LinkBroken(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@attrs.define(eq=False)
class _Pending:
    done: trio.Event = attrs.field(factory=trio.Event)
    reply: Message | None = None


#: A full resync of at least this many pages (500 facts each) settles the heap after each page: below it the view
#: is small enough for the collector to walk, and ``gc.freeze`` (process-wide, and cyclic garbage alive at that
#: moment is never collected) is not worth its cost.
FREEZE_MIN_PAGES = 4
#: Facts of a full resync folded per task step of the read loop (~2-4 ms at 100,000 machines on a loaded machine).
FOLD_STEP_FACTS = 100


def _settle_heap() -> None:
    """After a page of a full resync is folded: collect the young generations (cheap: what the page left) and
    freeze what survived, the view's records. The collector then never walks the view again: without this, a
    full collection over a view of 100,000 machines holds the loop for 100 ms and more, each time the heap has
    grown by a quarter. Frozen objects are still freed by their reference counts when a newer view replaces them."""
    gc.collect(1)
    gc.freeze()


class Link:
    def __init__(
        self,
        framed: FramedStream,
        generation: int,
        address: str,
        term: int,
        heartbeat_interval: float,
        heartbeat_timeout: float,
        request_timeout: float,
        *,
        updated: Pulse,
        corr: itertools.count[int],
        providers: tuple[str, ...],
        wanted: int = 0,
        snapshot_wait: float | None = None,
        refresh_interval: float = float("inf"),
        doubt: CommitDoubt | None = None,
        incarnation: str = "",
        base: FactView | None = None,
        lease_freed: Mapping[str, Pulse] | None = None,
    ) -> None:
        """``updated`` fires on every change of ``view`` (a new one built, a push folded); ``lease_freed`` fires a
        provider's pulse on its ``LeaseFreed`` push. The link calls no one: its owner reads ``view``."""
        self.framed = framed
        self.generation = generation
        self.address = address
        self.term = term
        self._interval = heartbeat_interval
        self._dead_after = heartbeat_timeout
        self._request_timeout = request_timeout
        self._updated = updated
        self._lease_freed = {} if lease_freed is None else lease_freed
        self._corr = corr
        self._providers = providers
        self.pending: dict[int, _Pending] = {}
        self.reason = ""
        self.last_ack = trio.current_time()
        #: The latest view this link built (each resync builds a new one), and why that resync was asked for.
        self.view: ControllerView | None = None
        self.view_reason = ""
        self.demand: DemandSnapshot | None = None
        self._assembler = DemandAssembler()
        self._resync: ResyncCollector | None = None  # the resync being collected
        self._resync_corr = 0
        self._resync_seq = 0  # ``wanted`` when the resync being collected was sent
        self._resync_reason = ""
        self._committed_during: list[CommittedFact] = []  # acknowledged while the resync is collected
        self._resync_progress = trio.Event()
        #: The session's resync-want counter; a resync is due while it is above the current view's ``sync_seq``.
        self.wanted = wanted
        self._wake_resync = trio.Event()
        self._snapshot_wait = snapshot_wait if snapshot_wait is not None else request_timeout
        self._refresh_interval = refresh_interval
        #: The controller's incarnation (JoinReply) and the facts this daemon holds from it: the first resync asks
        #: only for the facts after them (``base.synced_to``); later ones after the current view's.
        self._incarnation = incarnation
        self._base = base if incarnation else None
        self.host_seq = 0  # the controller's host-state seq for this connection that our hosts are as of
        self._digest_seen = False  # the controller sends a digest: no periodic refresh, a resync when it disagrees
        self._disagreements = 0
        self._digest_wants = False
        #: The session's commits whose outcome is unknown (``controller.commit_doubt``), and when our last resync
        #: began: one that began before a doubt's time does not settle it.
        self._doubt = doubt if doubt is not None else CommitDoubt()
        self._resync_began = 0.0
        self._scope = trio.CancelScope()
        self._outbox_send, self._outbox = trio.open_memory_channel[tuple[Message, int]](OUTBOX_SIZE)

    def break_(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
            log.info("controller link to %s broken: %s", self.address, reason)
        self._scope.cancel()

    def note_committed(self, committed: CommittedFact) -> None:
        """A fact this daemon committed was acknowledged: the view folds it, and the resync being collected folds it
        too (the controller answers commits between resync pages, so the pages, fixed when it began, may not hold
        it)."""
        if self._resync is not None:
            self._committed_during.append(committed)
        if self.view is not None:
            self.view.apply_fact(committed)  # a fact already folded (its index) is ignored

    def request_resync(self, seq: int) -> None:
        """Resync (again) with a request sent after this call, answering want ``seq``."""
        self.wanted = max(self.wanted, seq)
        self._wake_resync.set()

    async def run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    for loop in (self._write_loop, self._read_loop, self._heartbeat_loop, self._resync_loop):
                        nursery.start_soon(self._guarded, loop)
        finally:
            self.reason = self.reason or "link closed (cancelled)"
            for pending in self.pending.values():
                pending.done.set()  # reply stays None: the requester raises LinkDown

    async def _guarded(self, loop: Callable[[], object]) -> None:
        try:
            await loop()  # type: ignore[misc]
        except _LINK_ERRORS as exc:
            self.break_(describe_error(exc) if not isinstance(exc, LinkDown) else str(exc))

    # --- requests ----------------------------------------------------------------------------------------------

    async def request(self, msg: Message, corr: int, timeout: float) -> Message:
        if self.reason:
            raise LinkDown(self.reason)
        pending = self.pending[corr] = _Pending()
        try:
            with trio.move_on_after(timeout) as scope:
                await self._outbox_send.send((msg, corr))
                await pending.done.wait()
            if scope.cancelled_caught:
                self.break_(f"no reply to {opcode(msg)} within {timeout:g}s")
            if pending.reply is None:
                raise LinkDown(self.reason or "link ended")
            return pending.reply
        finally:
            self.pending.pop(corr, None)

    # --- tasks -------------------------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        async for first in self._outbox:
            batch = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(self._outbox.receive_nowait())
                except trio.WouldBlock:
                    break
            with trio.fail_after(self._request_timeout):
                await self.framed.send_many(batch)

    async def _heartbeat_loop(self) -> None:
        seq = 0
        next_send = trio.current_time()
        while True:
            now = trio.current_time()
            if now >= self.last_ack + self._dead_after:
                raise LinkDown(f"no heartbeat ack for {self._dead_after:g}s")
            if now >= next_send:
                seq += 1
                await self._outbox_send.send((Heartbeat(seq), next(self._corr)))
                next_send = now + self._interval
            await trio.sleep_until(min(next_send, self.last_ack + self._dead_after))

    async def _resync_loop(self) -> None:
        reason = "join"
        snapshot_wait = self._snapshot_wait
        while True:
            await self._resync_once(reason)
            done = trio.current_time()
            refresh_at, snapshot_by = done + self._refresh_interval, done + snapshot_wait
            while True:
                self._wake_resync = trio.Event()  # before the checks: a want registered after them wakes us
                reason = self._resync_due(refresh_at, snapshot_by)
                if reason:
                    break
                wake_at = float("inf") if self._digest_seen else refresh_at  # a digest replaces the refresh
                wake_at = min(wake_at, self._doubt.wake_at(self._resync_began))
                with trio.move_on_at(wake_at if self.demand is not None else min(wake_at, snapshot_by)):
                    await self._wake_resync.wait()
            if self.demand is not None:
                snapshot_wait = self._snapshot_wait
            elif reason == "no_demand_snapshot":
                snapshot_wait = min(snapshot_wait * 2, max(self._refresh_interval, self._snapshot_wait))

    def _resync_due(self, refresh_at: float, snapshot_by: float) -> str:
        """Why the next resync is due now ("" if it is not)."""
        assert self.view is not None
        now = trio.current_time()
        if self.wanted > self.view.sync_seq:
            return "requested"
        if self._digest_wants:
            return "digest"
        if self._doubt.due(now, self._resync_began):
            return "commit_unknown"
        if self.demand is None and now >= snapshot_by:
            return "no_demand_snapshot"
        if now >= refresh_at and not self._digest_seen:
            return "refresh"
        return ""

    async def _resync_once(self, reason: str) -> None:
        self._resync_began = trio.current_time()
        self._resync = ResyncCollector()
        self._committed_during = []
        self._resync_corr, self._resync_seq, self._resync_reason = next(self._corr), self.wanted, reason
        self._resync_progress = trio.Event()
        self._digest_wants, self._disagreements = False, 0
        base = self._base if self.view is None else self.view.facts
        after = base.synced_to if base is not None and self._incarnation else 0
        request = ResyncRequest(self._providers, after, self._incarnation if after else "")
        await self._outbox_send.send((request, self._resync_corr))
        # Each page must follow the previous one within the request timeout; a big resync may take many.
        while self._resync is not None:
            with trio.move_on_after(self._request_timeout) as scope:
                await self._resync_progress.wait()
            if scope.cancelled_caught:
                raise LinkDown(f"resync made no progress for {self._request_timeout:g}s")
            self._resync_progress = trio.Event()

    async def _read_loop(self) -> None:
        while True:
            # A kind only clients send is refused (OpcodeNotAllowed, a ProtocolError) before its body is decoded.
            envelope = await self.framed.receive(ALLOWED[Role.CONTROLLER], Role.CONTROLLER.value)
            if envelope is None:
                raise LinkDown("the controller closed the connection")
            msg, corr = envelope.msg, envelope.corr
            if isinstance(msg, ResyncPage) and corr == self._resync_corr and self._resync is not None:
                await self._resync_page_in_steps(msg)
            else:
                self._route(msg, corr)
            # Frames already buffered are read without waiting on the stream: yield between them, so a burst of
            # resync pages is folded one page per task step, never several in one stretch of the loop.
            await trio.lowlevel.checkpoint()

    async def _resync_page_in_steps(self, msg: ResyncPage) -> None:
        """A page of the resync in progress, folded ``FOLD_STEP_FACTS`` facts per task step (a page of 500 facts
        took one step of 10-20 ms on a loaded machine), then the heap settled in a step of its own."""
        collector = self._resync
        assert collector is not None
        self._resync_progress.set()
        tail = (msg.incremental, msg.as_of, msg.host_seq)
        done = collector.add(msg.page, msg.page_count, msg.facts, msg.hosts, tail, fold=False)
        if not collector.incremental:
            await trio.lowlevel.checkpoint()  # the page's decode was this task's step so far
            while collector.fold_step(FOLD_STEP_FACTS):
                await trio.lowlevel.checkpoint()
            if msg.page_count >= FREEZE_MIN_PAGES:
                await trio.lowlevel.checkpoint()
                _settle_heap()
        if done and self._resync is collector:  # not replaced by a newer resync meanwhile
            self._resync_done(collector)

    def _resync_page(self, msg: ResyncPage) -> None:
        """A page of the resync in progress, folded at once (``_route``'s way; the read loop folds in steps)."""
        collector = self._resync
        if collector is None:
            raise ProtocolError("a resync page after the resync completed")
        self._resync_progress.set()
        done = collector.add(msg.page, msg.page_count, msg.facts, msg.hosts, (msg.incremental, msg.as_of, msg.host_seq))
        if not collector.incremental and msg.page_count >= FREEZE_MIN_PAGES:
            _settle_heap()
        if done:
            self._resync_done(collector)

    def _resync_done(self, collector: ResyncCollector) -> None:
        """The last page is in: build the new view (folding what is left) and put it in place."""
        self._resync = None
        old = self.view
        base = self._base if old is None else old.facts
        self._base = None  # held only until the first resync is in
        args = (self.generation, self.address, self.term)
        version = 0 if old is None else old.version + 1
        if collector.incremental and base is not None and base.synced_to:
            view = collector.build_incremental(base, *args, sync_seq=self._resync_seq, version=version)
        else:
            view = collector.build(*args, sync_seq=self._resync_seq, version=version)
        self.host_seq = collector.host_seq
        for committed in sorted(self._committed_during, key=lambda c: c.index):
            view.facts.apply(committed)  # one the pages already held is ignored (its index)
        self._committed_during = []
        view.demand = self.demand
        self.view, self.view_reason = view, self._resync_reason
        self._updated.fire()
        self._resync_progress.set()  # wakes ``_resync_once`` if it took the page's own set already (steps between)

    def _check_digest(self, ack: HeartbeatAck) -> None:
        """Resync (incrementally) when the controller's digest disagrees with what we hold twice running: once
        may be a push or a commit acknowledgement still on its way (protocol §6.3)."""
        if not (ack.last_index or ack.demand_seq or ack.host_seq):
            return  # an older controller: no digest, the periodic refresh stays
        self._digest_seen = True
        view = self.view
        if view is None or self._resync is not None:
            return
        behind = (
            ack.last_index > view.facts.last_index
            or (self.demand is not None and ack.demand_seq != self.demand.seq)
            or ack.host_seq > self.host_seq
        )
        self._disagreements = self._disagreements + 1 if behind else 0
        if self._disagreements >= 2 and not self._digest_wants:
            log.info(
                "controller digest disagrees: index %s (ours %s), demand %s (ours %s), hosts %s (ours %s)",
                ack.last_index,
                view.facts.last_index,
                ack.demand_seq,
                None if self.demand is None else self.demand.seq,
                ack.host_seq,
                self.host_seq,
            )
            self._digest_wants = True
            self._wake_resync.set()

    def _route(self, msg: Message, corr: int) -> None:
        match msg:
            case HeartbeatAck(term=term):
                self.last_ack = trio.current_time()
                if term != self.term:
                    raise LinkDown(f"the controller's term moved from {self.term} to {term}")
                self._check_digest(msg)
            case ErrorMsg(code=code, message=text):
                raise LinkDown(f"controller error {code}: {text}")
            case DemandPage(snapshot_seq=seq, page=page, page_count=count, items=items) if corr == 0:
                snapshot = self._assembler.add(seq, page, count, items, msg.licenses)
                if snapshot is not None:
                    self.demand = snapshot
                    if self.view is not None:
                        self.view.set_demand(snapshot)
                        self._updated.fire()
            case HostStatePush(hosts=hosts, seq=seq) if corr == 0:
                # Before the resync is folded a push is dropped: the resync (sent after it) carries newer state.
                if self.view is not None:
                    self.host_seq = max(self.host_seq, seq)
                    self.view.apply_hosts(hosts)
                    self._updated.fire()
            case LeaseFreed(provider=provider) if corr == 0:
                pulse = self._lease_freed.get(provider)
                if pulse is not None:
                    pulse.fire()
            case ResyncPage() if corr == self._resync_corr:
                self._resync_page(msg)
            case _ if corr in self.pending:
                pending = self.pending[corr]
                if pending.reply is None:
                    pending.reply = msg
                    pending.done.set()
            case _ if corr != 0:
                log.debug("reply %s for corr %s nobody waits for (timed out)", opcode(msg), corr)
            case _:
                raise ProtocolError(f"unexpected push {opcode(msg)}")
