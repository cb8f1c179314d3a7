"""An in-memory controller for the lease keeper and the mutation gate, on trio's clock.

It implements the controller's lease rules from DESIGN.md ("The lease") and nothing else: grants with a TTL measured
on the controller's clock from when the request arrives, a fresh epoch ``(term, seq)`` per grant, renewals only for
the current holder and epoch, a grace after failover before the provider goes to a different holder (the previous
holder gets it back at once), and fact commits accepted only under the provider's current, unexpired epoch.

Each daemon talks to it through a ``FakeLink`` (a ``LeaseTransport`` and a ``FactCommitter``) whose faults are
switches: ``partitioned`` (requests get no reply; they fail with ``LinkDown`` after ``request_timeout``, like the real
session), ``latency`` (one way), and ``ack_delay`` (extra time before a fact ack). Tests run it on
``MockClock(autojump_threshold=0)``; the simulation can use it too.
"""

from __future__ import annotations

import itertools

import attrs
import trio

from provisionerd.controller.lease import LeaseGranted, LeaseRefused, LeaseReply
from provisionerd.domain.errors import ControllerRejected, LinkDown
from provisionerd.domain.model import CommittedFact, Epoch, Fact


@attrs.define
class _Lease:
    holder: str
    epoch: Epoch
    expires: float  # controller clock


@attrs.define(eq=False)
class FakeController:
    ttl: float = 30.0
    grace: float = 30.0
    term: int = 1
    facts: list[CommittedFact] = attrs.field(factory=list)
    leases: dict[str, _Lease] = attrs.field(factory=dict)
    #: provider -> holder on the latest committed fact (survives failover, like the fact log does)
    last_holder: dict[str, str] = attrs.field(factory=dict)
    promoted_at: float = float("-inf")
    grants: list[tuple[float, str, str, Epoch]] = attrs.field(factory=list)  # (time, provider, holder, epoch)
    _seq: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    def link(self, identity: str, **kwargs: object) -> FakeLink:
        return FakeLink(self, identity, **kwargs)  # type: ignore[arg-type]

    def failover(self) -> None:
        """A new primary: next term, the in-memory lease table is gone, the grace starts now."""
        self.term += 1
        self.leases.clear()
        self.promoted_at = trio.current_time()

    def _next_epoch(self) -> Epoch:
        return Epoch(self.term, next(self._seq))

    def holder(self, provider: str) -> _Lease | None:
        lease = self.leases.get(provider)
        return lease if lease is not None and trio.current_time() < lease.expires else None

    def acquire(self, identity: str, provider: str) -> LeaseReply:
        now = trio.current_time()
        current = self.holder(provider)
        if current is not None and current.holder != identity:
            return LeaseRefused("held", retry_after=current.expires - now)
        in_grace = now < self.promoted_at + self.grace
        previous = self.last_holder.get(provider)
        if current is None and in_grace and previous is not None and previous != identity:
            return LeaseRefused("grace", retry_after=self.promoted_at + self.grace - now)
        epoch = self._next_epoch()
        self.leases[provider] = _Lease(identity, epoch, now + self.ttl)
        self.grants.append((now, provider, identity, epoch))
        return LeaseGranted(epoch, self.ttl)

    def renew(self, identity: str, provider: str, epoch: Epoch) -> LeaseReply:
        current = self.holder(provider)
        if current is None or current.holder != identity or current.epoch != epoch:
            return LeaseRefused("stale_epoch")
        current.expires = trio.current_time() + self.ttl
        return LeaseGranted(epoch, self.ttl)

    def release(self, identity: str, provider: str, epoch: Epoch) -> None:
        current = self.holder(provider)
        if current is not None and current.holder == identity and current.epoch == epoch:
            del self.leases[provider]

    def commit(self, identity: str, fact: Fact) -> int:
        # As the reference controller does: a fact equal to one in the log (a retry whose ack was lost, or an
        # intent re-gated under the same epoch) is acknowledged with its existing index, whatever the lease now.
        for committed in reversed(self.facts):
            if committed.fact == fact:
                return committed.index
        current = self.holder(fact.provider)
        if current is None or current.holder != identity or current.epoch != fact.epoch:
            raise ControllerRejected("stale_epoch", f"epoch {fact.epoch} is not the current one")
        index = len(self.facts) + 1
        self.facts.append(CommittedFact(index, fact))
        self.last_holder[fact.provider] = identity
        return index


@attrs.define(eq=False)
class FakeLink:
    """One daemon's connection to a ``FakeController``."""

    controller: FakeController
    identity: str
    latency: float = 0.0
    ack_delay: float = 0.0
    request_timeout: float = 10.0
    partitioned: bool = False
    _healed: trio.Event = attrs.field(factory=trio.Event)

    def partition(self) -> None:
        self.partitioned = True
        self._healed = trio.Event()

    def heal(self) -> None:
        self.partitioned = False
        self._healed.set()

    async def wait_ready(self) -> None:
        if self.partitioned:
            await self._healed.wait()

    async def _travel(self) -> None:
        # A partitioned request never arrives: the real session gives up after its request timeout.
        if self.partitioned:
            await trio.sleep(self.request_timeout)
            raise LinkDown("no reply (partitioned)")
        await trio.sleep(self.latency)

    async def _back(self) -> None:
        await trio.sleep(self.latency)
        if self.partitioned:  # the reply is lost on the way back
            await trio.sleep(self.request_timeout)
            raise LinkDown("no reply (partitioned)")

    async def acquire(self, provider: str) -> LeaseReply:
        await self._travel()
        reply = self.controller.acquire(self.identity, provider)
        await self._back()
        return reply

    async def renew(self, provider: str, epoch: Epoch) -> LeaseReply:
        await self._travel()
        reply = self.controller.renew(self.identity, provider, epoch)
        await self._back()
        return reply

    async def release(self, provider: str, epoch: Epoch) -> None:
        await self._travel()
        self.controller.release(self.identity, provider, epoch)
        await self._back()

    async def commit(self, fact: Fact) -> int:
        await self._travel()
        index = self.controller.commit(self.identity, fact)
        await trio.sleep(self.ack_delay)
        await self._back()
        return index
