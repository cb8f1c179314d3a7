"""The per-provider epoch lease, kept on trio's clock.

A ``LeaseKeeper`` acquires the lease for one provider, renews it every ``ttl * renew_fraction``, and trusts it
only until ``renew_sent + ttl - margin``, where ``renew_sent`` is the local monotonic time the acquire/renew request
was *sent* (the controller's TTL started no earlier than that, so the local deadline is conservative however long
the reply took). When that deadline passes without a successful renewal the lease **lapses at once**: the state
changes, waiters and guards are woken or cancelled, and a ``lease_lost`` event is emitted. The keeper then
re-acquires with jittered exponential backoff (or the controller's ``retry_after``). A keeper waiting after a
denial is woken early by ``lease_freed`` (the controller pushed ``LeaseFreed``: the holder released the lease or let
it expire) and asks again at once: a standby takes over a cleanly released lease without waiting out the hint. The
push is only a hint: the controller's rules (grace, quorum) still decide, and a second denial waits again.

The epochs the keeper holds never go backwards: a grant carrying an epoch below one already held is refused. A
grant of the *same* epoch after a local lapse is the controller still counting us as the holder of that lease,
which is safe (no one else held it in between) and is reported as a new acquisition of that epoch.

A grant whose TTL this keeper's ``margin`` cannot use (``config.proofs.lease_window_problem``: the lease would be
expired on arrival, or lapse before its first renewal) is not retried: the keeper logs one ERROR, emits one
``lease_unusable`` event and acquires no more (the provider does not run) until it is cancelled, instead of being
refused as ``grant_too_late`` twice a second for ever.

Before a new grant is held, the keeper's ``judge`` (the daemon's ``AmnesiaGuard``) judges it: an epoch not above
the highest the controller granted before is amnesia, and a finding refuses the grant (``lease_denied`` with reason
``controller_amnesia``); a grant held is told to it (``note_granted``). While the judge is halted no lease is valid,
and a lease held when it halts lapses at once (the keeper waits on ``judge.wait_halted``); the epochs held before a
halt belong to the forgotten log, so after the admin's reset they no longer bound the next grant.

The keeper reads what the session saw, never the other way round: it renews at once when the ``rejoined`` pulse
fires (a new link: the new primary may not know us), and a keeper waiting after a denial asks again when its
``freed`` pulse fires (``controller.pulse``).

The keeper talks to the controller through a ``LeaseTransport`` so tests can drive it on
``MockClock(autojump_threshold=0)`` with an in-memory fake controller.
"""

from __future__ import annotations

import contextlib
import enum
import random
from collections.abc import Iterator
from typing import Protocol

import attrs
import trio

from provisionerd.config.loader import Backoff
from provisionerd.config.proofs import RENEW_FRACTION, lease_window_problem
from provisionerd.controller.backoff import BackoffTimer
from provisionerd.controller.pulse import Pulse
from provisionerd.domain.errors import LeaseError, LinkDown, MutationsHalted
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.events import EventLog

#: Refusal reasons that say the lease may still be ours (the controller could not answer for now): the keeper
#: keeps retrying until its local deadline. Any other refusal of a renewal lapses the lease at once.
TRANSIENT_REASONS = frozenset({"no_quorum", "not_primary"})


@attrs.frozen
class LeaseGranted:
    epoch: Epoch
    ttl: float  # seconds


@attrs.frozen
class LeaseRefused:
    reason: str  # held | grace | no_quorum | not_primary | stale_epoch | no_lease ...
    retry_after: float = 0.0  # seconds; 0 = use our own backoff


LeaseReply = LeaseGranted | LeaseRefused


class LeaseTransport(Protocol):
    """How a keeper reaches the controller. Every call raises ``LinkDown`` when the link is down or breaks."""

    async def wait_ready(self) -> None:
        """Return once a request has a chance to go out (the link is up and joined)."""

    async def acquire(self, provider: str) -> LeaseReply: ...

    async def renew(self, provider: str, epoch: Epoch) -> LeaseReply: ...

    async def release(self, provider: str, epoch: Epoch) -> None: ...


class GrantJudge(Protocol):
    """What judges a grant before it is held and must stop every lease at once when it halts (``AmnesiaGuard``)."""

    alarms: int  # how many halts so far

    @property
    def halted(self) -> str | None: ...

    def check_grant(self, provider: str, epoch: Epoch, held_this_start: Epoch | None) -> object | None:
        """A finding (anything but ``None``) refuses the grant."""

    def note_granted(self, provider: str, epoch: Epoch) -> None: ...

    async def wait_halted(self) -> None:
        """Return once a halt is in force."""


class LeaseState(enum.Enum):
    NONE = "none"  # never held (or waiting for the first grant)
    HELD = "held"
    LAPSED = "lapsed"  # held once; the local deadline passed or the controller said it is gone
    RELEASED = "released"  # given back on shutdown


@attrs.frozen
class LeaseStatus:
    """A point-in-time view for ``provisionerd status`` (``remaining`` in seconds, ``None`` unless held)."""

    provider: str
    state: LeaseState
    epoch: Epoch | None
    remaining: float | None
    reason: str


class LeaseKeeper:
    """Holds one provider's lease. Run ``await nursery.start(keeper.run)``; read with ``current()``/``valid()``."""

    def __init__(
        self,
        provider: str,
        transport: LeaseTransport,
        *,
        margin: float,
        backoff: Backoff,
        rng: random.Random,
        events: EventLog,
        renew_fraction: float = RENEW_FRACTION,
        judge: GrantJudge | None = None,
        rejoined: Pulse | None = None,
        freed: Pulse | None = None,
    ) -> None:
        """``judge``: judges every grant before it is held and halts every lease (see the module docstring).
        ``rejoined``: fired on each new link (renew at once); ``freed``: fired when the controller says this
        provider's lease ended (ask again at once). Without them the keeper renews on its schedule and waits out
        each denial."""
        if not 0 < renew_fraction < 1:
            raise ValueError(f"renew_fraction must be in (0, 1), not {renew_fraction!r}")
        self.provider = provider
        self._transport = transport
        self._margin = margin
        self._backoff = BackoffTimer(backoff, rng)
        self._retry = BackoffTimer(attrs.evolve(backoff, max=min(backoff.max, 1.0)), rng)
        self._events = events
        self._renew_fraction = renew_fraction
        self.state = LeaseState.NONE
        self.epoch: Epoch | None = None
        self.valid_until = float("-inf")
        self.reason = "not acquired yet"
        self.highest_epoch: Epoch | None = None
        self._guards: set[trio.CancelScope] = set()
        self._changed = trio.Event()
        self._hold_scope: trio.CancelScope | None = None
        #: What this keeper reads, never calls back: the grant judge, and the session's pulses.
        self.judge = judge
        self._alarms_seen = 0 if judge is None else judge.alarms
        self.rejoined = rejoined
        self._rejoins_seen = 0 if rejoined is None else rejoined.count
        self.freed = freed

    # --- reading ----------------------------------------------------------------------------------------------

    def valid(self, now: float | None = None) -> bool:
        """True while held and ``now`` is before the local deadline (at the deadline itself it is not valid)."""
        now = trio.current_time() if now is None else now
        return self.state is LeaseState.HELD and now < self.valid_until and not self._halted()

    def _halted(self) -> str | None:
        return None if self.judge is None else self.judge.halted

    def current(self, now: float | None = None) -> Epoch:
        """The epoch held *now*, or ``LeaseError`` (``MutationsHalted`` while the judge halts every mutation: nothing
        waits for the lease then, an admin decides)."""
        now = trio.current_time() if now is None else now
        halted = self._halted()
        if halted is not None:
            raise MutationsHalted(self.provider, halted)
        if self.state is LeaseState.HELD and now < self.valid_until and self.epoch is not None:
            return self.epoch
        if self.state is LeaseState.HELD:
            raise LeaseError(self.provider, f"local deadline passed (epoch {self.epoch})")
        raise LeaseError(self.provider, f"{self.state.value}: {self.reason}")

    def status(self, now: float | None = None) -> LeaseStatus:
        now = trio.current_time() if now is None else now
        held = self.valid(now)
        return LeaseStatus(
            provider=self.provider,
            state=self.state if held or self.state is not LeaseState.HELD else LeaseState.LAPSED,
            epoch=self.epoch,
            remaining=(self.valid_until - now) if held else None,
            reason=self.reason,
        )

    async def wait_changed(self) -> None:
        """Return at the next state change (acquired, renewed, lapsed, released)."""
        await self._changed.wait()

    async def wait_valid(self) -> Epoch:
        while not self.valid():
            await self.wait_changed()
        assert self.epoch is not None
        return self.epoch

    @contextlib.contextmanager
    def guard(self, epoch: Epoch) -> Iterator[trio.CancelScope]:
        """A cancel scope that is cancelled when the lease for ``epoch`` lapses (its deadline follows renewals).

        Raises ``LeaseError`` if ``epoch`` is not valid now. After the block, ``scope.cancelled_caught`` tells the
        caller its wait was cut short by the lease.
        """
        if self.current() != epoch:
            raise LeaseError(self.provider, f"epoch {epoch} is no longer the one held ({self.epoch})")
        scope = trio.CancelScope(deadline=self.valid_until)
        self._guards.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._guards.discard(scope)

    # --- changes ----------------------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _hold(self, grant: LeaseGranted, sent: float, renewed: bool) -> None:
        if self.state is LeaseState.RELEASED:
            return  # given back on shutdown: a late grant must not revive it
        self.state = LeaseState.HELD
        self.epoch = grant.epoch
        self.valid_until = sent + grant.ttl - self._margin
        self.reason = "renewed" if renewed else "acquired"
        self.highest_epoch = grant.epoch if self.highest_epoch is None else max(self.highest_epoch, grant.epoch)
        for scope in self._guards:
            scope.deadline = self.valid_until
        kind = "lease_renewed" if renewed else "lease_acquired"
        self._events.emit(
            kind,
            provider=self.provider,
            epoch=grant.epoch,
            ttl=grant.ttl,
            valid_for=round(self.valid_until - trio.current_time(), 6),
        )
        if not renewed and self.judge is not None:
            self.judge.note_granted(self.provider, grant.epoch)
        self._notify()

    def _lapse(self, reason: str) -> None:
        if self.state is not LeaseState.HELD:
            return
        self.state = LeaseState.LAPSED
        self.reason = reason
        for scope in self._guards:
            scope.cancel()
        self._events.emit("lease_lost", provider=self.provider, epoch=self.epoch, reason=reason)
        self._notify()
        if self._hold_scope is not None:
            self._hold_scope.cancel()

    def invalidate(self, epoch: Epoch, reason: str) -> None:
        """Lapse now if ``epoch`` is the one held (e.g. the controller rejected a fact as ``stale_epoch``)."""
        if self.state is LeaseState.HELD and self.epoch == epoch:
            self._lapse(reason)

    # --- the loop ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Acquire, keep, and after every lapse re-acquire, until cancelled."""
        task_status.started()
        while self.state is not LeaseState.RELEASED:
            grant, sent, rejoins = await self._acquire()
            self._rejoins_seen = rejoins  # a rejoin before this grant was sent is answered by the grant itself
            self._hold(grant, sent, renewed=False)
            with trio.CancelScope() as self._hold_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watchdog)
                    nursery.start_soon(self._renew_loop, grant.ttl, sent)
                    if self.judge is not None:
                        nursery.start_soon(self._halt_watch, self.judge)
            self._hold_scope = None

    async def _acquire(self) -> tuple[LeaseGranted, float, int]:
        """A grant to hold, when its request was sent, and the ``rejoined`` count then."""
        self._backoff.reset()
        while True:
            await self._transport.wait_ready()
            sent = trio.current_time()
            rejoins = 0 if self.rejoined is None else self.rejoined.count
            # A push answers a denial sent from now on (the link keeps the order).
            freed_seen = 0 if self.freed is None else self.freed.count
            try:
                reply = await self._transport.acquire(self.provider)
            except LinkDown as exc:
                delay = self._backoff.next_delay()
                self.reason = f"link down: {exc}"
            else:
                delay, accepted = self._judge_grant(reply, sent)
                if accepted:
                    assert isinstance(reply, LeaseGranted)
                    return reply, sent, rejoins
            if delay == float("inf"):  # a grant this keeper cannot use: a push changes nothing (_refuse_unusable)
                await trio.sleep_forever()
            with trio.move_on_after(delay):
                if self.freed is None:
                    await trio.sleep_forever()
                await self.freed.wait_after(freed_seen)
            if self.freed is not None and self.freed.count > freed_seen:  # woken by it, or told in the same instant
                self._events.emit("lease_freed", provider=self.provider)

    def _judge_grant(self, reply: LeaseReply, sent: float) -> tuple[float, bool]:
        """Whether an acquire reply is a grant we may hold; otherwise how long to wait before trying again."""
        if isinstance(reply, LeaseRefused):
            self.reason = f"denied: {reply.reason}"
            self._events.emit(
                "lease_denied", provider=self.provider, reason=reply.reason, retry_after=reply.retry_after
            )
            return (reply.retry_after if reply.retry_after > 0 else self._backoff.next_delay()), False
        unusable = lease_window_problem(reply.ttl, self._margin, self._renew_fraction)
        if unusable is not None:
            return self._refuse_unusable(reply, unusable), False
        if self.judge is not None:
            if self.judge.alarms != self._alarms_seen:
                # The epochs held before a halt belong to the forgotten log: after the admin's accept-reset the
                # controller counts from its own term again (the simulation's store_loss found a daemon refusing
                # 1.1 below 1.2 forever). No grant is held while halted, so nothing is trusted on this.
                self._alarms_seen = self.judge.alarms
                self.highest_epoch = None
            if self.judge.check_grant(self.provider, reply.epoch, self.highest_epoch) is not None:
                self.reason = f"refused a grant of epoch {reply.epoch}: controller amnesia"
                self._events.emit(
                    "lease_denied", provider=self.provider, reason="controller_amnesia", epoch=reply.epoch
                )
                return self._backoff.next_delay(), False
        if self.highest_epoch is not None and reply.epoch < self.highest_epoch:
            self.reason = f"refused a grant of epoch {reply.epoch} below {self.highest_epoch}"
            self._events.emit(
                "lease_denied",
                provider=self.provider,
                reason="epoch_went_backwards",
                epoch=reply.epoch,
                highest=self.highest_epoch,
            )
            return self._backoff.next_delay(), False
        if sent + reply.ttl - self._margin <= trio.current_time():
            self.reason = f"grant of epoch {reply.epoch} arrived after its local deadline"
            self._events.emit("lease_denied", provider=self.provider, reason="grant_too_late", epoch=reply.epoch)
            return self._backoff.next_delay(), False
        return 0.0, True

    def _refuse_unusable(self, grant: LeaseGranted, why: str) -> float:
        """A TTL this keeper's margin cannot use: retrying would only be refused the same way, twice a second
        forever, so the keeper says so once (ERROR, ``lease_unusable``) and waits for ever (until cancelled or
        released): the provider does not run under this config. Returns that wait."""
        fix = "lower lease.margin or raise the controller's lease TTL"
        self.reason = f"lease unusable: {why}; {fix}"
        # One ERROR line (the event's, telemetry.severity): the provider will not run, and what to change.
        self._events.emit(
            "lease_unusable",
            provider=self.provider,
            epoch=grant.epoch,
            ttl=grant.ttl,
            margin=self._margin,
            detail=why,
            fix=fix,
        )
        return float("inf")

    async def _watchdog(self) -> None:
        # Sleep to the current deadline; renewals move it, so re-check on waking.
        while True:
            await trio.sleep_until(self.valid_until)
            if trio.current_time() >= self.valid_until:
                self._lapse("local deadline passed without a renewal")
                return

    async def _halt_watch(self, judge: GrantJudge) -> None:
        await judge.wait_halted()
        self._lapse(judge.halted or "halted")

    async def _renew_loop(self, ttl: float, sent: float) -> None:
        assert self.epoch is not None
        epoch = self.epoch
        next_renew = sent + ttl * self._renew_fraction
        self._retry.reset()
        while True:
            with trio.move_on_at(next_renew):
                if self.rejoined is None:
                    await trio.sleep_forever()
                await self.rejoined.wait_after(self._rejoins_seen)
            if self.rejoined is not None:
                self._rejoins_seen = self.rejoined.count  # the renewal sent now answers every rejoin so far
            sent = trio.current_time()
            try:
                reply = await self._transport.renew(self.provider, epoch)
            except LinkDown as exc:
                self.reason = f"renewal failed: {exc}"
                next_renew = trio.current_time() + self._retry.next_delay()
                continue
            if trio.current_time() >= self.valid_until:
                # The reply came at or after the local deadline: the lease lapsed in that instant, and a lapse is
                # final for this holding (the watchdog may not have run yet in this same tick).
                self._lapse("local deadline passed before the renewal reply")
                return
            if isinstance(reply, LeaseGranted) and reply.epoch == epoch:
                if sent + reply.ttl - self._margin > self.valid_until:
                    self._hold(reply, sent, renewed=True)
                next_renew = sent + reply.ttl * self._renew_fraction
                self._retry.reset()
            elif isinstance(reply, LeaseRefused) and reply.reason in TRANSIENT_REASONS:
                self.reason = f"renewal refused: {reply.reason}"
                wait = reply.retry_after if reply.retry_after > 0 else self._retry.next_delay()
                next_renew = trio.current_time() + wait
            else:
                what = reply.reason if isinstance(reply, LeaseRefused) else f"renewal returned epoch {reply.epoch}"
                self._lapse(f"renewal refused: {what}")
                return

    async def release(self, timeout: float = 2.0) -> None:
        """Stop mutations for this provider now and give the lease back (best effort, bounded by ``timeout``).

        The caller cancels ``run`` first (or this is called after it ended); afterwards the keeper stays released.
        """
        epoch, held = self.epoch, self.state is LeaseState.HELD
        self.state = LeaseState.RELEASED
        self.reason = "released"
        for scope in self._guards:
            scope.cancel()
        self._notify()
        if held and epoch is not None:
            # Trust ends here, before the controller is told: it may grant the next epoch as soon as it reads the
            # release, before its answer (and ``lease_released``) is back.
            self._events.emit("lease_releasing", provider=self.provider, epoch=epoch)
            confirmed = False
            with trio.move_on_after(timeout):
                try:
                    await self._transport.release(self.provider, epoch)
                    confirmed = True
                except LinkDown:
                    pass  # the controller will see the lease expire instead
            self._events.emit("lease_released", provider=self.provider, epoch=epoch, confirmed=confirmed)
