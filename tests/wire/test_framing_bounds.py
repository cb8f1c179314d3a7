"""FramedStream's server-side bounds: the kind check before decoding, the shared buffer pool, the decode budget."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import messages, u64

from provisionerd.domain.errors import BuffersExhausted, FrameOverBounds, OpcodeNotAllowed
from provisionerd.domain.model import DemandItem, ResourceShape
from provisionerd.testing.hostile_frames import list_bomb
from provisionerd.wire import bounds, codec, framing
from provisionerd.wire.codec import PREFIX_BYTES
from provisionerd.wire.framing import HEADER, BufferPool, DecodeBudget, FramedStream, frame_bytes
from provisionerd.wire.messages import MESSAGE_TYPES, AdminStatus, DemandPage, Heartbeat


def _pair(**options: object) -> tuple[FramedStream, FramedStream]:
    left, right = trio.testing.memory_stream_pair()
    return FramedStream(left), FramedStream(right, **options)  # type: ignore[arg-type]


async def test_a_kind_outside_allowed_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(framing, "decode_metered", lambda body: calls.append(body))
    client, server = _pair()
    await client.send_raw(frame_bytes(list_bomb("adminSetDemand", ("items",))))
    with pytest.raises(OpcodeNotAllowed, match="role 'worker' may not send 'adminSetDemand'"):
        await server.receive({Heartbeat, AdminStatus}, "worker")
    assert calls == []


async def test_the_pool_caps_bytes_buffered_across_connections_and_gets_them_back() -> None:
    pool = BufferPool(limit=100_000)
    a_client, a = _pair(pool=pool)
    b_client, b = _pair(pool=pool)
    c_client, c = _pair(pool=pool)
    free = framing.POOL_FREE_BYTES
    await a_client.send_raw(HEADER.pack(free + 80_000) + b"\0" * (free + 70_000))  # a half-sent frame, held
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.receive_body)
        await trio.testing.wait_all_tasks_blocked()
        assert pool.in_use == 8 + 70_000
        await b_client.send_raw(HEADER.pack(free + 50_000) + b"\0" * (free + 50_000))
        with pytest.raises(BuffersExhausted):
            await b.receive_body()
        # A small frame fits in any connection's allowance, however full the pool is.
        await c_client.send(Heartbeat(2), 1)
        assert (await c.receive()).msg == Heartbeat(2)  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()
    assert pool.refused == 1
    a.release()
    b.release()
    assert pool.in_use == 0


async def test_a_complete_frame_gives_its_bytes_back() -> None:
    pool = BufferPool(limit=1 << 20)
    client, server = _pair(pool=pool)
    await client.send(Heartbeat(1), 3)
    assert (await server.receive()).msg == Heartbeat(1)  # type: ignore[union-attr]
    assert pool.in_use == 0


def test_the_decode_budget_makes_an_expensive_peer_wait() -> None:
    trio.run(_decode_budget, clock=trio.testing.MockClock(autojump_threshold=0))


async def _decode_budget() -> None:
    budget = DecodeBudget(rate=1000, burst=1500)
    client, server = _pair(budget=budget)
    bomb = frame_bytes(list_bomb("demandPage", ("items",), 500))  # 1001 units: the page and 500 items
    for _ in range(3):
        await client.send_raw(bomb)
    start = trio.current_time()
    for _ in range(3):
        await server.receive()
    # 1500 - 1001 = 499 left after the first; the second waits for nothing, overdraws to -502; the third waits
    # 0.502 s for it to refill to zero.
    assert trio.current_time() - start == pytest.approx(0.502)
    assert budget.waited == pytest.approx(0.502)


def test_budget_and_pool_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        DecodeBudget(rate=0, burst=1)


class Trickle(trio.abc.ReceiveStream):
    """Hands out ``data`` ``size`` bytes at a time, and only the first ``readable`` bytes of it: reading past them
    fails the test (the reader had to refuse the frame first)."""

    def __init__(self, data: bytes, readable: int, size: int = 1 << 16) -> None:
        self.data, self.readable, self.size = data, readable, size
        self.handed_out = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.handed_out >= self.readable:
            raise AssertionError(f"read past byte {self.readable}")
        n = min(self.size, max_bytes or self.size, self.readable - self.handed_out)
        chunk = self.data[self.handed_out : self.handed_out + n]
        self.handed_out += len(chunk)
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


ALL_KINDS = frozenset(MESSAGE_TYPES)
PREFIXED = HEADER.size + PREFIX_BYTES  # a header and what peek_prefix reads


@pytest.mark.parametrize("method", ["receive", "receive_checked"])
async def test_a_kind_outside_allowed_is_refused_on_the_prefix_unread(method: str) -> None:
    stream = Trickle(frame_bytes(list_bomb("adminSetDemand", ("items",))), readable=PREFIXED, size=16)
    framed = FramedStream(stream)  # type: ignore[arg-type]
    with pytest.raises(OpcodeNotAllowed, match="role 'worker' may not send 'adminSetDemand'"):
        await getattr(framed, method)({Heartbeat, AdminStatus}, "worker")
    assert stream.handed_out == PREFIXED


@pytest.mark.parametrize("allowed", [ALL_KINDS, frozenset({AdminStatus})], ids=["allowed", "not-allowed"])
async def test_a_body_over_its_kinds_bound_is_refused_on_the_prefix_before_the_kind_check(
    allowed: frozenset[type],
) -> None:
    body = codec.encode(Heartbeat(7), 1)
    body += bytes(bounds.SMALL_BODY + 8 - len(body))  # a heartbeat 8 bytes over its bound
    stream = Trickle(frame_bytes(body), readable=PREFIXED)
    framed = FramedStream(stream)  # type: ignore[arg-type]
    with pytest.raises(FrameOverBounds, match=f"a heartbeat frame of {bounds.SMALL_BODY + 8} bytes, at most"):
        await framed.receive(allowed, "worker")
    assert stream.handed_out == PREFIXED


@given(
    frames=st.lists(st.tuples(messages, u64), min_size=1, max_size=6),
    size=st.integers(1, 300),
)
@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
def test_receive_checked_gives_the_bodies_sent_at_any_chunk_size_and_the_pool_gets_all_back(frames, size):
    # Small bodies (<= PREFIX_BYTES) take the path that peeks the whole body, larger ones the prefix path.
    bodies = [codec.encode(msg, corr) for msg, corr in frames]
    data = b"".join(frame_bytes(body) for body in bodies)

    async def main() -> list[bytes | None]:
        pool = BufferPool(limit=1 << 20)
        framed = FramedStream(Trickle(data, len(data) + 1, size), pool=pool)  # type: ignore[arg-type]
        got = [await framed.receive_checked(ALL_KINDS) for _ in bodies]
        assert pool.in_use == 0
        return got

    assert trio.run(main) == bodies


def _big_page() -> bytes:
    """A real 185 KB DemandPage body: our encoder lays it out in several segments, so its kind is peeked whole."""
    items = tuple(DemandItem(f"d{n:03d}-" + "x" * 200, ResourceShape(ncpus=1, mem_mb=1), 1) for n in range(400))
    return codec.encode(DemandPage(1, 0, 1, items), 9)


def _big_bomb() -> bytes:
    """A single-segment body of POOL_FREE_BYTES + 8 KiB: its kind is peeked from its prefix."""
    return list_bomb("demandPage", ("items",), 500, size=framing.POOL_FREE_BYTES + 8192)


@pytest.mark.parametrize("make", [_big_page, _big_bomb], ids=["segments", "one-segment"])
async def test_receive_checked_charges_the_pool_for_a_big_frame_and_gives_it_back(make) -> None:
    pool = BufferPool(limit=1 << 20)
    client, server = _pair(pool=pool)
    body = make()
    data = frame_bytes(body)
    cut = framing.POOL_FREE_BYTES + 4096
    await client.send_raw(data[:cut])
    got: list[bytes | None] = []
    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            got.append(await server.receive_checked(ALL_KINDS, "controller"))

        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        assert pool.in_use == cut - framing.POOL_FREE_BYTES  # what came beyond the connection's free allowance
        await client.send_raw(data[cut:])
    assert got == [body]
    assert pool.in_use == 0


async def test_a_big_frame_received_with_allowed_decodes_and_gives_the_pool_back() -> None:
    pool = BufferPool(limit=1 << 20)
    client, server = _pair(pool=pool)
    body = _big_page()
    await client.send_raw(frame_bytes(body))
    assert await server.receive(ALL_KINDS, "controller") == codec.decode(body)
    assert pool.in_use == 0
