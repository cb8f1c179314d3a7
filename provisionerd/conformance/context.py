"""What every check gets: the connector, the addresses, the options, and the few helpers checks share.

The kit works on providers of its own (``<prefix>-<purpose>``, a fresh prefix per run), so its leases and facts
never touch a real provider's and two runs never meet. The intents it commits are ended at the end
(``RequestFailed``), so they leave the controller's resync set (they stay in its log for audit).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from provisionerd.conformance.peer import Connector, Peer, describe, join_primary, new_instance
from provisionerd.conformance.results import CheckFailed
from provisionerd.domain.model import Epoch, RequestFailed, RequestIntent, Role
from provisionerd.wire.messages import (
    AdminReply,
    FactAck,
    FactCommit,
    Join,
    JoinReply,
    LeaseAcquire,
    LeaseDenied,
    LeaseGrant,
    LeaseRelease,
    LeaseRenew,
    Message,
)

IDENTITY = "conformance-kit"
#: Facts committed between two lease renewals.
COMMIT_BATCH = 50


@attrs.frozen
class KitOptions:
    admin: bool = False
    timeout: float = 10.0  # per request
    grace_wait: float = 90.0  # how long an acquire waits out a grace after promotion (the controller's start)
    close_wait: float = 5.0  # how long a refused connection may stay open
    max_frame: int = 1 << 20  # the deployment's frame limit


@attrs.frozen
class Tokens:
    """The workers the kit's intent gave a token to (instance refs and tokens, in order) and their provider."""

    provider: str
    refs: tuple[str, ...]
    tokens: tuple[str, ...] = attrs.field(repr=False)
    #: The intent's op id (its ``instanceFact``s name it).
    op_id: str = ""


@attrs.define(eq=False)
class Context:
    connector: Connector
    addresses: tuple[str, ...]
    options: KitOptions
    prefix: str = attrs.field(factory=lambda: f"kit-{secrets.token_hex(3)}")
    instance: str = attrs.field(factory=new_instance)
    #: (provider, op_id) of every intent committed, ended at ``cleanup``.
    intents: list[tuple[str, str]] = attrs.field(factory=list)
    peers: list[Peer] = attrs.field(factory=list)
    #: Results one setup gives several rows (the resync's pages).
    memo: dict[str, Any] = attrs.field(factory=dict)
    _ops: int = 0

    def provider(self, purpose: str) -> str:
        return f"{self.prefix}-{purpose}"

    def op_id(self) -> str:
        self._ops += 1
        return f"{self.prefix}-op{self._ops}"

    def join_msg(self, providers: Sequence[str], instance: str | None = None) -> Join:
        return Join(
            Role.PROVISIONER,
            IDENTITY,
            providers=tuple(providers),
            instance=self.instance if instance is None else instance,
        )

    async def provisioner(self, providers: Sequence[str], instance: str | None = None) -> tuple[Peer, JoinReply]:
        """A provisioner joined at the primary, closed at the end of the run."""
        peer, reply = await join_primary(self.connector, self.addresses, self.join_msg(providers, instance))
        self.peers.append(peer)
        return peer, reply

    async def acquire(self, peer: Peer, provider: str) -> LeaseGrant:
        """Acquire, waiting out a ``grace`` denial (a controller that just started or failed over) within
        ``grace_wait``, heartbeating meanwhile (a grace outlasts a heartbeat timeout: 35 s at the reference
        controller's defaults against 15 s); ``CheckFailed`` for any other answer."""
        deadline = trio.current_time() + self.options.grace_wait
        while True:
            reply = await peer.request(LeaseAcquire(provider))
            if isinstance(reply, LeaseGrant):
                return reply
            if isinstance(reply, LeaseDenied) and reply.reason == "grace" and trio.current_time() < deadline:
                await peer.keep_alive(min(max(reply.retry_after_ms / 1000, 0.05), deadline - trio.current_time()))
                continue
            raise CheckFailed(f"LeaseAcquire({provider!r}) answered {describe(reply)}")

    async def commit(self, peer: Peer, fact: Any) -> int:
        return (await self.commit_ack(peer, fact)).index

    async def commit_ack(self, peer: Peer, fact: Any) -> FactAck:
        """``commit``, and the whole ack (its ``committed_at`` too)."""
        reply = await peer.request(FactCommit(fact))
        if not isinstance(reply, FactAck):
            raise CheckFailed(f"FactCommit of {type(fact).__name__} answered {describe(reply)}")
        if isinstance(fact, RequestIntent):
            self.intents.append((fact.provider, fact.op_id))
        return reply

    async def commit_renewing(self, peer: Peer, provider: str, epoch: Epoch, facts: Sequence[Any]) -> list[int]:
        """``commit_many`` in batches, renewing the lease before each, as a daemon would: many commits take time."""
        acked: list[int] = []
        for start in range(0, len(facts), COMMIT_BATCH):
            renewed = await peer.request(LeaseRenew(provider, epoch))
            if not isinstance(renewed, LeaseGrant):
                raise CheckFailed(f"renew of {epoch} after {start} commits answered {describe(renewed)}")
            acked += await self.commit_many(peer, facts[start : start + COMMIT_BATCH])
        return acked

    async def commit_many(self, peer: Peer, facts: Sequence[Any]) -> list[int]:
        """Commit ``facts`` pipelined; their indexes. ``CheckFailed`` naming the first one not acknowledged."""
        replies = await peer.request_many([FactCommit(fact) for fact in facts])
        for fact, reply in zip(facts, replies, strict=True):
            if isinstance(reply, FactAck) and isinstance(fact, RequestIntent):
                self.intents.append((fact.provider, fact.op_id))
        for fact, reply in zip(facts, replies, strict=True):
            if not isinstance(reply, FactAck):
                raise CheckFailed(f"FactCommit of {type(fact).__name__} {fact.op_id!r} answered {describe(reply)}")
        return [reply.index for reply in replies if isinstance(reply, FactAck)]

    def intent(self, provider: str, epoch: Epoch, count: int = 1, ref_size: int = 0) -> tuple[RequestIntent, list[str]]:
        """An intent for ``count`` machines, its tokens returned apart (``ref_size``: pad instance refs to it)."""
        op = self.op_id()
        refs = [f"{op}-m{i}".ljust(ref_size, "x") for i in range(count)]
        tokens = [secrets.token_urlsafe(32) for _ in range(count)]
        hashes = [hashlib.sha256(t.encode()).hexdigest() for t in tokens]
        fact = RequestIntent(provider, epoch, op, "kit-template", count, tuple(refs), tuple(hashes), "kit")
        return fact, tokens

    async def worker_tokens(self, purpose: str, count: int) -> Tokens:
        """Fresh worker tokens for one row: a provisioner holding ``<prefix>-<purpose>`` commits an intent for
        ``count`` machines and releases the lease (each token admits one worker once, so no row takes another's)."""
        provider = self.provider(purpose)
        peer, _ = await self.provisioner([provider])
        grant = await self.acquire(peer, provider)
        fact, tokens = self.intent(provider, grant.epoch, count=count)
        await self.commit(peer, fact)
        await peer.request(LeaseRelease(provider, grant.epoch))
        return Tokens(provider, fact.instance_refs, tuple(tokens), fact.op_id)

    async def admin(self, msg: Message) -> dict[str, Any]:
        """One admin request at the primary (a connection per call, as failovers close them)."""
        peer, _ = await join_primary(self.connector, self.addresses, Join(Role.ADMIN, IDENTITY))
        try:
            reply = await peer.request(msg)
        finally:
            await peer.aclose()
        if not isinstance(reply, AdminReply) or not reply.ok:
            raise CheckFailed(f"{type(msg).__name__} answered {describe(reply)}")
        document: dict[str, Any] = json.loads(reply.json) if reply.json else {}
        return document

    async def cleanup(self) -> str:
        """End every intent the kit committed (``RequestFailed``) and release its leases; best effort."""
        ended, problems = 0, []
        by_provider: dict[str, list[str]] = {}
        for provider, op in self.intents:
            by_provider.setdefault(provider, []).append(op)
        for provider, ops in by_provider.items():
            try:
                peer, _ = await self.provisioner([provider])
                grant = await self.acquire(peer, provider)
                for start in range(0, len(ops), COMMIT_BATCH):
                    batch = ops[start : start + COMMIT_BATCH]
                    await peer.request(LeaseRenew(provider, grant.epoch))
                    failed = [FactCommit(RequestFailed(provider, grant.epoch, op, "conformance kit")) for op in batch]
                    for op, reply in zip(batch, await peer.request_many(failed), strict=True):
                        if isinstance(reply, FactAck):
                            ended += 1
                        else:
                            problems.append(f"{op}: {describe(reply)}")
                await peer.request(LeaseRelease(provider, grant.epoch))
            except CheckFailed as exc:
                problems.append(f"{provider}: {exc}")
        for peer in self.peers:
            await peer.aclose()
        self.peers.clear()
        return f"{ended} of {len(self.intents)} intents ended" + (f"; {'; '.join(problems)}" if problems else "")
