"""A minimal sequential client and an in-memory harness for the reference controller's server tests."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from provisionerd.domain.model import Epoch, Role
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import DemandPage, Envelope, Join, JoinReply, LeaseAcquire, LeaseGrant, Message
from refcontroller.cluster import Cluster
from refcontroller.server import ControllerServer, Timeouts, open_controller_server
from refcontroller.store import FactStore


@attrs.define(eq=False)
class Peer:
    """Sends requests one at a time; frames with ``corr == 0`` that arrive meanwhile are kept in ``pushes``."""

    framed: FramedStream
    pushes: list[Message] = attrs.field(factory=list)
    _corr: itertools.count = attrs.field(factory=lambda: itertools.count(1))

    async def request(self, msg: Message) -> Message:
        [reply] = await self.request_many(msg, 1)
        return reply

    async def request_many(self, msg: Message, count: int) -> list[Message]:
        corr = next(self._corr)
        await self.framed.send(msg, corr)
        replies: list[Message] = []
        while len(replies) < count:
            envelope = await self.receive_envelope()
            if envelope.corr == corr:
                replies.append(envelope.msg)
            else:
                assert envelope.corr == 0, envelope
                self.pushes.append(envelope.msg)
        return replies

    async def receive_envelope(self) -> Envelope:
        envelope = await self.framed.receive()
        assert envelope is not None, "the controller closed the connection"
        return envelope

    async def push(self) -> Message:
        """The next push (one kept earlier, or the next frame, which must be a push)."""
        if self.pushes:
            return self.pushes.pop(0)
        envelope = await self.receive_envelope()
        assert envelope.corr == 0, envelope
        return envelope.msg

    async def closed(self) -> bool:
        """True when the controller closed the connection (after any frames still in flight are read)."""
        try:
            while (envelope := await self.framed.receive()) is not None:
                self.pushes.append(envelope.msg)
        except trio.BrokenResourceError:
            pass
        return True


@attrs.define(eq=False)
class Harness:
    server: ControllerServer
    nursery: trio.Nursery

    @property
    def cluster(self) -> Cluster:
        return self.server.cluster

    def open_stream(self, replica: int, role: Role) -> FramedStream:
        client, server_side = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.handle_stream, server_side, replica, role)
        return FramedStream(client)

    async def join(self, role: Role, identity: str = "d1", replica: int = 0, **fields: object) -> tuple[Peer, Message]:
        peer = Peer(self.open_stream(replica, role))
        reply = await peer.request(Join(role=role, identity=identity, **fields))
        return peer, reply


@asynccontextmanager
async def memory_controller(
    data: Path,
    replicas: int = 3,
    ttl: float = 30.0,
    check: float = 5.0,
    heartbeat: float = 600.0,
    send: float | None = None,
) -> AsyncIterator[Harness]:
    """A controller on in-memory streams, on whatever clock the test runs (use MockClock)."""
    store = FactStore.open(data / "facts.sqlite")
    try:
        cluster = Cluster.open(store, replicas, ttl, check, trio.current_time())
        cluster.replicas.addresses = [f"replica{i}.test:700{i}" for i in range(replicas)]
        timeouts = Timeouts(heartbeat=heartbeat, handshake=10.0, send=heartbeat if send is None else send)
        async with open_controller_server(cluster, timeouts=timeouts, wall_clock=trio.current_time) as server:
            async with trio.open_nursery() as nursery:
                yield Harness(server, nursery)
                nursery.cancel_scope.cancel()
    finally:
        store.close()


def on_mock_clock(fn):  # type: ignore[no-untyped-def]
    """Decorator: run ``async def test(...)`` in ``trio.run`` on ``MockClock(autojump_threshold=0)`` from t=0."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        return trio.run(functools.partial(fn, *args, **kwargs), clock=trio.testing.MockClock(autojump_threshold=0))

    return wrapper


async def tls_peer(certs_dir: Path, address: str, role: Role) -> Peer:
    """A TLS connection to ``address`` with ``role``'s certificate from ``certs_dir`` (not yet joined)."""
    from provisionerd.wire.tls import client_ssl_context
    from refcontroller import addresses

    host, port = addresses.parse(address)
    stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=client_ssl_context(certs_dir, role))
    _OPEN_STREAMS.append(stream)
    return Peer(FramedStream(stream))


#: Client streams the tests opened; ``on_real_clock`` closes them all when the test ends.
_OPEN_STREAMS: list[trio.abc.Stream] = []


def track(stream: trio.abc.Stream) -> trio.abc.Stream:
    _OPEN_STREAMS.append(stream)
    return stream


def on_real_clock(fn):  # type: ignore[no-untyped-def]
    """Decorator: run ``async def test(...)`` in ``trio.run`` on the real clock, failing after 60 s."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        async def bounded() -> None:
            try:
                with trio.fail_after(60):
                    await fn(*args, **kwargs)
            finally:
                while _OPEN_STREAMS:
                    await trio.aclose_forcefully(_OPEN_STREAMS.pop())

        return trio.run(bounded)

    return wrapper


def seq_term(msg: Message) -> tuple[int, int]:
    """A heartbeat ack's seq and term (its digest aside: protocol §6.3)."""
    from provisionerd.wire.messages import HeartbeatAck

    assert isinstance(msg, HeartbeatAck), msg
    return msg.seq, msg.term


async def joined_provisioner(
    h: Harness, identity: str = "d1", replica: int = 0, providers: tuple[str, ...] = ("aws",), **join: Any
) -> Peer:
    """A provisioner accepted by replica ``replica``, past the demand snapshot that follows every join; ``join``
    goes to ``Harness.join`` (``instance``)."""
    peer, reply = await h.join(Role.PROVISIONER, identity, replica, providers=providers, **join)
    assert isinstance(reply, JoinReply) and reply.accepted, reply
    page = await peer.push()
    assert isinstance(page, DemandPage)  # a snapshot follows every join
    return peer


async def granted(peer: Peer, provider: str = "aws") -> Epoch:
    """The epoch of the lease ``peer`` asked for (it must be granted)."""
    reply = await peer.request(LeaseAcquire(provider))
    assert isinstance(reply, LeaseGrant), reply
    return reply.epoch
