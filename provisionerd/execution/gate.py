"""The mutation gate: no provider mutation starts without a valid lease and an acknowledged intent fact.

Every mutating provider call goes through::

    async with gate.mutation("sim", RequestIntent(provider="sim", epoch=NO_EPOCH, op_id=..., ...)) as permit:
        await runtime.request_machines(..., epoch=permit.epoch)

``mutation`` (1) takes the lease epoch held *now* (``LeaseError`` if none), (2) stamps the intent with it and commits
it, waiting for the primary's ack under a guard that is cancelled the instant the lease lapses, (3) re-checks the
lease after the ack, and only then (4) lets the body run. If any step fails, the body never runs and a typed error
says why: ``MutationsHalted`` (a ``LeaseError``: the daemon is halted because the controller forgot what it
acknowledged, see ``controller.amnesia_guard``; checked first, and again after the ack), ``LeaseError`` (no lease,
or it lapsed before/at the ack), ``ControllerRejected`` (e.g. ``stale_epoch``:
the keeper is told to re-acquire), ``LinkDown`` (the commit's outcome is unknown; an intent that did get committed
is resolved later by its op_id, like any call whose outcome is unknown).

A call that has started is not cancelled when the lease lapses: the cloud cannot be fenced mid-call, and its op_id
and owner tags let the next holder find what it did.

Every decision is recorded (``GateDecision``) so tests and the simulation can check invariant 1: each admitted
mutation carries an acknowledged intent stamped with the epoch held at admission, before the local deadline.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.domain.errors import ControllerRejected, LeaseError, LinkDown, MutationsHalted
from provisionerd.domain.model import Epoch, Fact
from provisionerd.domain.permit import CURRENT_PERMIT
from provisionerd.telemetry.events import EventLog

#: Rejections of an intent that mean our epoch is not (or no longer) the provider's current one.
LEASE_LOST_REASONS = frozenset({"stale_epoch", "no_lease"})


class FactCommitter(Protocol):
    async def commit(self, fact: Fact) -> int:
        """Commit ``fact`` on the primary; return its log index. Raises ``ControllerRejected`` or ``LinkDown``."""


@attrs.frozen
class GateDecision:
    """One gate outcome. ``outcome``: admitted | halted | no_lease | rejected | link_down | lapsed_before_ack |
    lapsed_after_ack | finished. ``at`` is trio's clock."""

    at: float
    provider: str
    op_id: str
    fact_kind: str
    outcome: str
    epoch: Epoch | None = None
    fact_epoch: Epoch | None = None
    fact_index: int | None = None
    valid_until: float | None = None
    detail: str = ""


@attrs.frozen
class Permit:
    """What the body of ``mutation`` gets: the epoch to stamp on the call and the committed intent."""

    epoch: Epoch
    fact: Fact
    fact_index: int
    admitted_at: float


class MutationGate:
    def __init__(
        self,
        leases: Mapping[str, LeaseKeeper],
        committer: FactCommitter,
        events: EventLog,
        *,
        keep: int = 100_000,
        halted: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``halted``: why every mutation is stopped now, or ``None`` (the daemon's ``AmnesiaGuard.halted``)."""
        self._leases = leases
        self._committer = committer
        self._events = events
        self._halted = halted
        #: Refusals because the daemon was halted (status shows it).
        self.halted_refusals = 0
        self.decisions: collections.deque[GateDecision] = collections.deque(maxlen=keep)

    def _record(self, decision: GateDecision) -> None:
        self.decisions.append(decision)
        self._events.emit(
            "gate",
            provider=decision.provider,
            op_id=decision.op_id,
            fact=decision.fact_kind,
            outcome=decision.outcome,
            epoch=decision.epoch,
            index=decision.fact_index,
            detail=decision.detail,
        )

    @contextlib.asynccontextmanager
    async def mutation(self, provider: str, intent: Fact) -> AsyncIterator[Permit]:
        """Pass the gate for ``provider`` with ``intent`` (its ``epoch`` is replaced by the one held now)."""
        if intent.provider != provider:
            raise ValueError(f"intent is for provider {intent.provider!r}, not {provider!r}")
        lease = self._leases.get(provider)
        if lease is None:
            raise LeaseError(provider, "this daemon does not serve it")

        def decide(
            outcome: str,
            *,
            epoch: Epoch | None = None,
            fact_epoch: Epoch | None = None,
            fact_index: int | None = None,
            valid_until: float | None = None,
            detail: str = "",
        ) -> GateDecision:
            decision = GateDecision(
                trio.current_time(),
                provider,
                intent.op_id,
                type(intent).__name__,
                outcome,
                epoch,
                fact_epoch,
                fact_index,
                valid_until,
                detail,
            )
            self._record(decision)
            return decision

        halted = self._halted()
        if halted is not None:
            self.halted_refusals += 1
            decide("halted", detail=halted)
            raise MutationsHalted(provider, halted)
        try:
            epoch = lease.current()
        except LeaseError as exc:
            decide("no_lease", detail=str(exc))
            raise
        stamped = attrs.evolve(intent, epoch=epoch)
        index: int | None = None
        try:
            with lease.guard(epoch) as guard:
                index = await self._committer.commit(stamped)
        except ControllerRejected as exc:
            decide("rejected", epoch=epoch, fact_epoch=epoch, detail=exc.reason)
            if exc.reason in LEASE_LOST_REASONS:
                lease.invalidate(epoch, f"intent rejected: {exc.reason}")
            raise
        except LinkDown as exc:
            decide("link_down", epoch=epoch, fact_epoch=epoch, detail=str(exc))
            raise
        except LeaseError as exc:  # guard() found the lease gone between current() and here
            decide("no_lease", epoch=epoch, detail=str(exc))
            raise
        if guard.cancelled_caught or index is None:
            decide("lapsed_before_ack", epoch=epoch, fact_epoch=epoch, valid_until=lease.valid_until)
            raise LeaseError(provider, f"lease for epoch {epoch} lapsed before the intent was acknowledged")
        now = trio.current_time()
        halted = self._halted()
        if halted is not None:
            self.halted_refusals += 1
            decide("halted", epoch=epoch, fact_epoch=epoch, fact_index=index, detail=halted)
            raise MutationsHalted(provider, halted)
        if not lease.valid(now) or lease.epoch != epoch:
            decide("lapsed_after_ack", epoch=epoch, fact_epoch=epoch, fact_index=index, valid_until=lease.valid_until)
            raise LeaseError(provider, f"lease for epoch {epoch} lapsed when the intent was acknowledged")
        decide("admitted", epoch=epoch, fact_epoch=epoch, fact_index=index, valid_until=lease.valid_until)
        token = CURRENT_PERMIT.set(_Held(lease, epoch, self._halted))
        try:
            yield Permit(epoch=epoch, fact=stamped, fact_index=index, admitted_at=now)
        finally:
            CURRENT_PERMIT.reset(token)
            decide(
                "finished",
                epoch=epoch,
                fact_index=index,
                detail="lease still valid" if lease.valid() else "lease lapsed during the call",
            )


@attrs.frozen
class _Held:
    """``domain.permit.StillPermitted`` for one admitted mutation: its keeper still holds ``epoch``, not halted."""

    keeper: LeaseKeeper
    epoch: Epoch
    halted: Callable[[], str | None]

    def valid(self) -> bool:
        return self.halted() is None and self.keeper.valid() and self.keeper.epoch == self.epoch


def violations(decisions: list[GateDecision] | collections.deque[GateDecision]) -> list[str]:
    """Invariant 1 over recorded decisions: every admitted mutation had an acknowledged intent (an index) stamped
    with the epoch held at admission, and was admitted strictly before the local deadline."""
    problems = []
    for d in decisions:
        if d.outcome != "admitted":
            continue
        if d.fact_index is None:
            problems.append(f"{d.op_id}: admitted without an acknowledged intent")
        if d.epoch is None or d.fact_epoch != d.epoch:
            problems.append(f"{d.op_id}: intent epoch {d.fact_epoch} is not the held epoch {d.epoch}")
        if d.valid_until is None or not d.at < d.valid_until:
            problems.append(f"{d.op_id}: admitted at {d.at} at/after the local deadline {d.valid_until}")
    return problems
