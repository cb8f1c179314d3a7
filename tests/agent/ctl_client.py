"""A minimal provisioner for the end-to-end tests: join the primary, take a lease, commit a RequestIntent."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import trio

from provisionerd.domain.model import Epoch, RequestIntent, Role
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import FactAck, FactCommit, Join, JoinReply, LeaseAcquire, LeaseGrant, Message
from provisionerd.wire.tls import client_ssl_context


class Provisioner:
    def __init__(self, framed: FramedStream) -> None:
        self.framed = framed
        self._corr = itertools.count(2)

    @classmethod
    async def join(cls, certs: Path, addresses: tuple[str, ...], provider: str) -> Provisioner:
        context = client_ssl_context(certs, Role.PROVISIONER)
        target = addresses[0]
        for _ in range(4):
            host, _, port = target.rpartition(":")
            stream = await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=context)
            framed = FramedStream(stream)
            await framed.send(Join(role=Role.PROVISIONER, identity="agent-e2e", providers=(provider,)), 1)
            envelope = await framed.receive()
            assert envelope is not None and isinstance(envelope.msg, JoinReply), envelope
            if envelope.msg.accepted:
                return cls(framed)
            await framed.aclose()
            target = envelope.msg.redirect
        raise AssertionError("no primary found")

    async def request(self, msg: Message) -> Message:
        corr = next(self._corr)
        await self.framed.send(msg, corr)
        while True:
            envelope = await self.framed.receive()
            assert envelope is not None, "the controller closed the connection"
            if envelope.corr == corr:
                return envelope.msg

    async def lease(self, provider: str) -> Epoch:
        """Acquire, retrying through the grace period of a fresh primary."""
        while True:
            reply = await self.request(LeaseAcquire(provider))
            if isinstance(reply, LeaseGrant):
                return reply.epoch
            await trio.sleep(max(0.05, getattr(reply, "retry_after_ms", 100) / 1000))

    async def commit_intent(self, provider: str, epoch: Epoch, op_id: str, refs: list[str], tokens: list[str]) -> int:
        hashes = tuple(hashlib.sha256(t.encode()).hexdigest() for t in tokens)
        fact = RequestIntent(provider, epoch, op_id, "local-1", len(refs), tuple(refs), hashes)
        reply = await self.request(FactCommit(fact))
        assert isinstance(reply, FactAck), reply
        return reply.index

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.framed.stream)
