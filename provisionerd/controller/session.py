"""The controller session: join as ``provisioner``, keep the link alive, rejoin and resync after every break.

``ControllerSession.run`` loops forever: open a stream to an address (through an injected ``StreamFactory``, so
tests use in-memory streams and production uses mutual TLS, see ``connect.py``), send ``Join``, follow a standby's
redirect to the primary (at most ``max_redirects`` hops in a row), and otherwise rotate through the configured
addresses with jittered exponential backoff (seeded RNG, trio's clock). Once joined it runs three tasks on the link:

- the reader routes replies to their request by ``corr`` and pushes (demand pages, host states) into the view;
- the heartbeat sends ``Heartbeat`` every ``heartbeat_interval`` and declares the link dead when no
  ``HeartbeatAck`` came for ``heartbeat_timeout``;
- the resync asks for the facts and hosts of our providers and builds a **new** ``ControllerView`` (the next
  generation) from them alone; the demand in it is the next snapshot received on this link. The link resyncs again
  (a new view of the same generation) when asked (``request_resync``), when no demand snapshot came after a resync,
  and every ``refresh_heartbeats`` heartbeat intervals (see ``controller.link``).

**A lease grant needs a resync.** Facts another daemon commits under its lease are never pushed to us, so after
any acquisition (not a renewal of a lease held without a break) the view may lack them: ``resync_after_grant``
registers a resync that must be *sent* after the grant, and ``synced_for(provider)`` stays false until a view built
from such a resync is in place. The reconcile loop plans a provider only when it is true (DESIGN: the daemon's
memory is a cache of the fact log, rebuilt from a resync).

Requests (``request``) are refused with ``LinkDown`` until that resync is folded, so nothing this daemon commits
can be folded before the facts that precede it. Any failure on the link (EOF, a protocol violation, an ``ErrorMsg``,
a dead heartbeat, a request without a reply in ``request_timeout``, a ``not_primary`` answer) ends the generation:
every pending request fails with ``LinkDown`` and the loop connects again.

**One instance per process start.** The ``Join`` carries ``instance``, drawn once when the session is built (one
session per ``DaemonCore``) from its injected RNG, or taken from ``SessionSettings.instance``. Every rejoin of this
session sends the same one, so the controller still counts us as the holder of the leases we held before a link
break (re-acquiring is idempotent: the same epoch); a restarted process has a new one and is a new holder, so it
cannot take over a lease its previous start may still be using, and a second live daemon with the same ``identity``
is a competitor, not a twin that would be told it holds the same epoch.

**A controller that forgot what it acknowledged is not served.** With an ``AmnesiaGuard`` (``amnesia_guard``),
every accepted ``JoinReply`` is judged before the link is served (its incarnation and last index against what the
daemon remembers), and every acknowledged or resynced fact index is remembered. A finding (or one raised by a
lease grant) halts the session: the link is closed, the state is ``halted``, and it joins again only once an admin
accepted the reset; nothing the forgetful controller says reaches a view.

The daemon reads ``session.view`` and waits on ``session.changed()``: the view is level-triggered state, so a
consumer that falls behind sees the latest picture instead of a queue of stale ones. The session calls no one back
either: it fires pulses (``controller.pulse``) that others wait on: ``rejoined`` once a new link's resync is in
place (the lease keepers renew at once), and ``lease_freed[provider]`` on the controller's ``LeaseFreed``.
``up_since`` is when the current link's first resync was in place (the orphan cycles' settle window counts from
it). The link it serves calls no one back: the session follows ``link.view`` and puts each new one in place.
``updates()`` delivers the same as a stream of views through a zero-buffer memory channel.
"""

from __future__ import annotations

import itertools
import logging
import math
import random

import trio

from provisionerd.controller.amnesia_guard import AmnesiaGuard
from provisionerd.controller.backoff import BackoffTimer
from provisionerd.controller.commit_doubt import CommitDoubt
from provisionerd.controller.joined_file import JoinedRefs
from provisionerd.controller.link import Link, LinkBroken
from provisionerd.controller.pulse import Pulse
from provisionerd.controller.session_settings import (
    CONNECT_ERRORS,
    MAX_INSTANCE,
    LinkState,
    SessionSettings,
    StreamFactory,
    new_instance,
)
from provisionerd.controller.storage_failures import StorageFailures
from provisionerd.controller.view import ControllerView
from provisionerd.domain.errors import LinkDown, ProtocolError, controller_rejection, describe_error
from provisionerd.domain.model import PROTOCOL_VERSION, CommittedFact, Role
from provisionerd.telemetry.events import EventLog
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import ErrorMsg, Join, JoinReply, LeaseDenied, Message, Rejected

log = logging.getLogger(__name__)


class _Halted(Exception):
    pass


class _Redirect(Exception):
    def __init__(self, target: str) -> None:
        self.target = target


#: How many more refs than twice the live fleet the set of machines seen joined may hold before it is pruned.
JOINED_SLACK = 1024


class ControllerSession:
    def __init__(
        self,
        settings: SessionSettings,
        connect: StreamFactory,
        events: EventLog,
        rng: random.Random,
        guard: AmnesiaGuard | None = None,
        joined: JoinedRefs | None = None,
    ):
        if not settings.addresses:
            raise ValueError("at least one controller address is needed")
        instance = settings.instance
        if len(instance) > MAX_INSTANCE or "#" in instance or not instance.isprintable():
            raise ValueError(f"instance must be at most {MAX_INSTANCE} printable characters without '#': {instance!r}")
        self.settings = settings
        self._connect = connect
        self._events = events
        self.guard = guard
        self._backoff = BackoffTimer(settings.backoff, rng)
        #: Sent in every Join of this session (rejoins included): the lease holder is identity + instance.
        self.instance = settings.instance or new_instance(rng)
        self.state = LinkState.DOWN
        self.primary: str | None = None
        self.term = 0
        self.generation = 0
        self.view: ControllerView | None = None
        #: Instance refs seen with a host (``ControllerView.joined``): since this process started, and before, when
        #: the builder gave it the daemon's file (``joined_file``).
        self.joined = JoinedRefs() if joined is None else joined
        self.last_error = ""
        #: ``Rejected{storageFailure}`` answers (the controller could not make a write durable): logged, counted.
        self.storage = StorageFailures(events)
        self._link: Link | None = None
        self._corr = itertools.count(1)
        self._updated = Pulse()  # the link state or the view changed
        self._ready = trio.Event()
        self._incarnation = ""  # the controller incarnation the current view's facts came from
        #: Whether the controller of the current link knows ``DrainRequested`` (``JoinReply.drains``).
        self.controller_drains = False
        self.controller_history = False  # JoinReply.history: the controller answers HistoryQuery
        self._sync_wanted = 0  # resync wants registered so far (a view answers those <= its sync_seq)
        #: Commits that ended without their ack: each link resyncs once more after them (controller.commit_doubt).
        self.commit_doubt = CommitDoubt()
        self._sync_needed: dict[str, int] = {}  # provider -> the want its last lease grant registered
        #: Fired once each new generation's first resync is in place (lease keepers renew at once).
        self.rejoined = Pulse()
        #: When (trio's clock) the current generation's first resync was in place (``inf`` before any).
        self.up_since = math.inf
        #: Fired per provider the controller pushed as freed (``LeaseFreed``): a waiting keeper acquires at once
        #: instead of at its ``retry_after``.
        self.lease_freed: dict[str, Pulse] = {provider: Pulse() for provider in settings.providers}

    # --- for the daemon -----------------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._updated.fire()

    async def changed(self) -> None:
        """Return at the next change of the link state or the view."""
        await self._updated.wait_after(self._updated.count)

    async def wait_ready(self) -> None:
        """Return once joined and resynced (requests may go out)."""
        while self.state is not LinkState.UP:
            await self._ready.wait()

    async def updates(
        self, *, task_status: trio.TaskStatus[trio.MemoryReceiveChannel[ControllerView]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Publish each new state of the view (coalesced) on a zero-buffer channel handed to ``task_status``."""
        send, receive = trio.open_memory_channel[ControllerView](0)
        task_status.started(receive)
        seen: tuple[int, int] | None = None
        async with send:
            while True:
                view = self.view
                if view is not None and (view.generation, view.version) != seen and self.state is LinkState.UP:
                    seen = (view.generation, view.version)
                    await send.send(view)
                    continue
                await self.changed()

    @property
    def incarnation(self) -> str:
        """The controller incarnation the current view's facts came from ("" before the first join)."""
        return self._incarnation

    def status(self) -> dict[str, object]:
        link = self._link
        return {
            "state": self.state.value,
            "instance": self.instance,
            "primary": self.primary,
            "term": self.term,
            "generation": self.generation,
            "last_heartbeat_ack_age": None if link is None else round(trio.current_time() - link.last_ack, 3),
            "demand_seq": None if self.view is None or self.view.demand is None else self.view.demand.seq,
            "last_error": self.last_error,
            "storage_failures": self.storage.count,
        }

    async def request(self, msg: Message, *, timeout: float | None = None) -> Message:
        """Send ``msg`` and return the reply with the same ``corr``.

        Raises:
            LinkDown: not joined and resynced, the link broke, or no reply within the timeout (which also breaks
                the link: a controller that stops answering is treated like a dead one).
            ControllerRejected: a typed ``Rejected`` reply (``not_primary`` also ends the link, to find the primary;
                ``storage_failure`` is a ``ControllerStorageFailure``, recorded by ``storage``; the link is kept).
        """
        link = self._link
        if link is None or self.state is not LinkState.UP:
            raise LinkDown(f"controller link is {self.state.value}")
        reply = await link.request(msg, next(self._corr), timeout or self.settings.request_timeout)
        if isinstance(reply, Rejected):
            if reply.reason == "not_primary":
                link.break_("the controller is no longer primary")
            rejection = controller_rejection(reply.reason, reply.detail)
            self.storage.note(msg, rejection)
            raise rejection
        if isinstance(reply, LeaseDenied) and reply.reason == "not_primary":
            link.break_("the controller is no longer primary")
        return reply

    def request_resync(self) -> int:
        """Ask for a resync sent after this call (on this link, or as the next link's first); returns the want's
        number: a view with ``sync_seq`` at or above it holds every fact committed before the call."""
        self._sync_wanted += 1
        if self._link is not None:
            self._link.request_resync(self._sync_wanted)
        return self._sync_wanted

    def resync_after_grant(self, provider: str) -> None:
        """A lease for ``provider`` was just acquired: it is not ``synced_for`` until a resync after now is in."""
        self._sync_needed[provider] = self.request_resync()

    def synced_for(self, provider: str) -> bool:
        """Whether the current view was resynced after ``provider``'s last lease grant (and the link is up)."""
        view = self.view
        return self.state is LinkState.UP and view is not None and view.sync_seq >= self._sync_needed.get(provider, 0)

    def break_link(self, reason: str) -> None:
        """End the current generation (e.g. the controller answered nonsense); the session rejoins."""
        if self._link is not None:
            self._link.break_(reason)

    def note_committed(self, committed: CommittedFact) -> None:
        """Fold a fact this daemon just committed into the current view (the same generation only)."""
        if self.guard is not None:
            self.guard.note_acknowledged(committed.index)
        link = self._link
        if link is not None:
            link.note_committed(committed)  # into the views it holds or is building
        if self.view is not None and (link is None or self.view is not link.view):
            self.view.apply_fact(committed)
        self._notify()

    # --- the loop -----------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, join, serve, and after any break do it all again, until cancelled."""
        task_status.started()
        addresses = self.settings.addresses
        position = 0
        target: str | None = None
        hops = 0
        while True:
            if self.guard is not None and self.guard.finding is not None:
                await self._wait_for_admin()
                target, hops = None, 0
                continue
            address = target or addresses[position % len(addresses)]
            target = None
            try:
                await self._attempt(address)
            except _Halted:
                continue
            except _Redirect as redirect:
                hops += 1
                self._events.emit("redirect", address=address, to=redirect.target, hops=hops)
                if hops <= self.settings.max_redirects:
                    target = redirect.target
                    continue
                self.last_error = f"more than {self.settings.max_redirects} redirects in a row"
            except LinkBroken as broken:  # joined, then lost: start again from the same address
                self.last_error = broken.reason
                hops = 0
                self._backoff.reset()
                await trio.sleep(self._backoff.next_delay())
                continue
            except (*CONNECT_ERRORS, _JoinRefused) as exc:
                self.last_error = f"{address}: {describe_error(exc) if not isinstance(exc, _JoinRefused) else exc}"
                # WARNING: a controller outage shows at log_level = "warning"; the handler collapses the repeats.
                log.warning("cannot join controller at %s", self.last_error)
            hops = 0
            position += 1
            self.state = LinkState.DOWN
            self._notify()
            await trio.sleep(self._backoff.next_delay())

    async def _wait_for_admin(self) -> None:
        assert self.guard is not None
        self.state = LinkState.HALTED
        self.last_error = self.guard.halted or ""
        self._notify()
        await self.guard.wait_cleared()
        self.last_error = ""
        self.state = LinkState.DOWN
        self._backoff.reset()
        self._notify()

    async def _attempt(self, address: str) -> None:
        self.state = LinkState.CONNECTING
        self._notify()
        s = self.settings
        with trio.fail_after(s.connect_timeout):
            stream = await self._connect(address)
        framed = FramedStream(stream)
        try:
            with trio.fail_after(s.connect_timeout):
                join = Join(
                    role=Role.PROVISIONER,
                    identity=s.identity,
                    protocol_version=PROTOCOL_VERSION,
                    providers=s.providers,
                    instance=self.instance,
                )
                await framed.send(join, 1)
                envelope = await framed.receive()
            reply = None if envelope is None else envelope.msg
            if isinstance(reply, ErrorMsg):
                raise _JoinRefused(f"{reply.code}: {reply.message}")
            if not isinstance(reply, JoinReply):
                raise ProtocolError(f"expected JoinReply, got {type(reply).__name__}")
            if not reply.accepted and reply.redirect and not reply.primary:
                raise _Redirect(reply.redirect)
            if not reply.accepted or not reply.primary:
                self._events.emit("join_refused", address=address, reason=reply.reason, primary=reply.primary)
                raise _JoinRefused(reply.reason or "join refused")
            if self.guard is not None and self.guard.check_join(reply.incarnation, reply.last_index) is not None:
                self._events.emit(
                    "join_refused",
                    address=address,
                    reason="controller_amnesia",
                    incarnation=reply.incarnation,
                    last_index=reply.last_index,
                )
                raise _Halted
            await self._serve(framed, address, reply)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _serve(self, framed: FramedStream, address: str, reply: JoinReply) -> None:
        s = self.settings
        self.generation += 1
        self.primary, self.term, self.state = address, reply.term, LinkState.SYNCING
        self.controller_drains = reply.drains
        self.controller_history = reply.history
        self._backoff.reset()
        self._events.emit(
            "join",
            address=address,
            term=reply.term,
            controller=reply.controller_id,
            generation=self.generation,
            instance=self.instance,
            incarnation=reply.incarnation,
            last_index=reply.last_index,
        )
        self._events.emit("link_up", address=address, generation=self.generation)
        link = Link(
            framed,
            self.generation,
            address,
            reply.term,
            s.heartbeat_interval,
            s.heartbeat_timeout,
            s.request_timeout,
            updated=self._updated,
            corr=self._corr,
            providers=s.providers,
            wanted=self._sync_wanted,
            snapshot_wait=max(s.request_timeout, s.heartbeat_interval),
            refresh_interval=s.heartbeat_interval * s.refresh_heartbeats or float("inf"),
            incarnation=reply.incarnation,
            # The facts we hold, if they came from this very incarnation: the first resync asks only for later ones.
            base=self.view.facts if self.view is not None and self._incarnation == reply.incarnation else None,
            lease_freed=self.lease_freed,
            doubt=self.commit_doubt,
        )
        self._incarnation = reply.incarnation
        self._link = link
        self._notify()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow, link)
                if self.guard is not None:
                    nursery.start_soon(self._break_on_halt, link, self.guard)
                await link.run()
                nursery.cancel_scope.cancel()
        finally:
            self._link = None
            self.state = LinkState.DOWN
            if self._ready.is_set():
                self._ready = trio.Event()
            self._events.emit("link_down", address=address, generation=self.generation, reason=link.reason)
            self._notify()
        raise LinkBroken(link.reason)

    async def _follow(self, link: Link) -> None:
        """Put each view the link builds in place (the link builds it; the session owns what it means)."""
        while True:
            seen = self._updated.count
            view = link.view
            if view is not None and view is not self.view:
                self._resynced(view, link.view_reason)
                continue
            await self._updated.wait_after(seen)

    @staticmethod
    async def _break_on_halt(link: Link, guard: AmnesiaGuard) -> None:
        await guard.wait_halted()
        link.break_(guard.halted or "controller amnesia")

    def _resynced(self, view: ControllerView, reason: str) -> None:
        # Every view shares the session's set of machines seen joined. It is pruned to the machines the facts still
        # name (active, or named by an open intent: a worker may join before its instance fact is committed) only
        # once it is twice the live fleet and more: a view that lacks a machine for a while (a store lost, then the
        # machine adopted) must not make it "never joined". One pass per resync, which costs as much anyway.
        joined = view.joined = self.joined
        joined.update(view.hosts)
        facts = view.facts
        if len(joined) > 2 * len(facts.active_refs) + JOINED_SLACK:
            pending = {ref for record in facts.open_intents() for ref in record.intent.instance_refs}
            joined.prune(facts.active_refs.keys() | pending)
        if self.guard is not None:
            self.guard.note_acknowledged(view.facts.last_index)
        if self.state is LinkState.UP and self.view is not None and self.view.generation == view.generation:
            # A later resync on the same link: the view is replaced; the link's state and leases are unchanged.
            self.view = view
            self._events.emit(
                "refresh",
                generation=view.generation,
                reason=reason,
                sync_seq=view.sync_seq,
                facts=view.facts.last_index,
                hosts=len(view.hosts),
                demand=view.demand is not None,
            )
            self._notify()
            return
        self.view = view
        self.state = LinkState.UP
        self._events.emit(
            "resync",
            generation=view.generation,
            facts=view.facts.last_index,
            fact_count=sum(1 for _ in view.facts.intents) + len(view.facts.machines),
            hosts=len(view.hosts),
        )
        self.up_since = trio.current_time()
        self._ready.set()
        self.rejoined.fire()
        self._notify()


class _JoinRefused(Exception):
    pass
