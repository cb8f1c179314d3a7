"""FramedStream's server-side bounds: the kind check before decoding, the shared buffer pool, the decode budget."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from provisionerd.domain.errors import BuffersExhausted, OpcodeNotAllowed
from provisionerd.testing.hostile_frames import list_bomb
from provisionerd.wire import framing
from provisionerd.wire.framing import HEADER, BufferPool, DecodeBudget, FramedStream, frame_bytes
from provisionerd.wire.messages import AdminStatus, Heartbeat


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
