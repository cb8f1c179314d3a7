"""FramedStream's writers take turns: their bytes never interleave, they go in the order they came, and a writer
that is cancelled (parked, or inside ``send_all``) or fails never keeps the others out."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from provisionerd.wire import messages as m
from provisionerd.wire.framing import HEADER, FramedStream, frame_bytes


class PiecemealStream(trio.abc.Stream):
    """Takes each ``send_all`` in ``pieces`` parts with a scheduler round between them (as a socket takes a big
    write) and, unlike an SSLStream, does not refuse a second writer: two writers in ``send_all`` at once would
    interleave their bytes in ``wire`` (and show in ``most_inside``). A write whose last byte is in ``hold`` then
    waits for that event before it returns (and raises ``fail`` after it)."""

    def __init__(self, pieces: int = 3) -> None:
        self.pieces = pieces
        self.wire = bytearray()
        self.hold: dict[int, trio.Event] = {}
        self.fail: dict[int, BaseException] = {}
        self.inside = 0  # writers in send_all now
        self.most_inside = 0

    async def send_all(self, data):
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            step = -(-len(data) // self.pieces)
            for start in range(0, len(data), step):
                self.wire += data[start : start + step]
                await trio.lowlevel.checkpoint()
            if data[-1] in self.hold:
                await self.hold[data[-1]].wait()
            if data[-1] in self.fail:
                raise self.fail[data[-1]]
        finally:
            self.inside -= 1

    async def wait_send_all_might_not_block(self):
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes=None):
        raise AssertionError("not read")

    async def aclose(self):
        await trio.lowlevel.checkpoint()


def on_mock_clock(fn: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run on a MockClock that jumps when every task waits, within a deadline: a writer left waiting for a turn
    that nobody hands on fails its test at once instead of hanging it."""

    async def bounded() -> None:
        with trio.fail_after(600):
            await fn()

    @functools.wraps(fn)
    def wrapper() -> None:
        trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))

    return wrapper


def _frame(tag: int, size: int = 40) -> bytes:
    """A frame whose body is ``size`` bytes of ``tag`` (the stream recognises a writer by its last byte)."""
    return frame_bytes(bytes([tag]) * size)


def _frames(wire: bytes) -> list[bytes]:
    """Split ``wire`` into frame bodies; a body that is not all one byte means two writers interleaved."""
    bodies, at = [], 0
    while at < len(wire):
        (length,) = HEADER.unpack_from(wire, at)
        body = bytes(wire[at + HEADER.size : at + HEADER.size + length])
        assert len(body) == length and len(set(body)) == 1, f"interleaved bytes at offset {at}"
        bodies.append(body)
        at += HEADER.size + length
    return bodies


@on_mock_clock
async def test_concurrent_writers_never_interleave_their_bytes_and_keep_their_order():
    stream = PiecemealStream(pieces=4)
    framed = FramedStream(stream)  # type: ignore[arg-type]
    per_writer = 30

    async def writer(tag: int) -> None:
        for i in range(per_writer):
            await framed.send_raw(_frame(tag, 24 + 8 * (i % 5)))

    async with trio.open_nursery() as nursery:
        for tag in (1, 2, 3, 4):
            nursery.start_soon(writer, tag)
    bodies = _frames(stream.wire)
    assert stream.most_inside == 1
    assert sorted(b[0] for b in bodies) == sorted([1, 2, 3, 4] * per_writer)
    for tag in (1, 2, 3, 4):
        assert [len(b) for b in bodies if b[0] == tag] == [24 + 8 * (i % 5) for i in range(per_writer)]


@on_mock_clock
async def test_concurrent_send_many_over_a_memory_stream_raise_no_busy_error():
    # memory_stream_pair raises BusyResourceError on overlapping send_all, as an SSLStream does.
    left, right = trio.testing.memory_stream_pair()
    sender, receiver = FramedStream(left), FramedStream(right)

    async def writer(tag: int) -> None:
        for i in range(20):
            await sender.send_many([(m.Heartbeat(i), tag), (m.Ack(), tag)])

    got: list[m.Envelope] = []
    async with trio.open_nursery() as nursery:
        for tag in (1, 2, 3):
            nursery.start_soon(writer, tag)
        while len(got) < 3 * 40:
            envelope = await receiver.receive()
            assert envelope is not None
            got.append(envelope)
    for tag in (1, 2, 3):
        mine = [e.msg for e in got if e.corr == tag]
        assert mine == [msg for i in range(20) for msg in (m.Heartbeat(i), m.Ack())]


@on_mock_clock
async def test_writers_take_turns_in_the_order_they_came_and_a_newcomer_does_not_overtake():
    # Writer 1 finishes and hands the turn to 2, queued with 3 behind it; writer 4 comes just then. trio runs a
    # round's tasks in either order, so 4 runs before 1 lets go in some trials and between 1 and 2 in others: it
    # must queue behind 3 in all of them.
    for _ in range(20):
        stream = PiecemealStream()
        framed = FramedStream(stream)  # type: ignore[arg-type]
        stream.hold[1] = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(framed.send_raw, _frame(1))
            await trio.testing.wait_all_tasks_blocked()
            for tag in (2, 3):
                nursery.start_soon(framed.send_raw, _frame(tag))
                await trio.testing.wait_all_tasks_blocked()
            stream.hold[1].set()
            await trio.lowlevel.cancel_shielded_checkpoint()
            await framed.send_raw(_frame(4))
        assert [b[0] for b in _frames(stream.wire)] == [1, 2, 3, 4]
        assert stream.most_inside == 1


@on_mock_clock
async def test_a_writer_cancelled_inside_send_all_passes_the_turn_on():
    stream = PiecemealStream()
    framed = FramedStream(stream)  # type: ignore[arg-type]
    stream.hold[1] = trio.Event()  # never set: writer 1 stays inside send_all until cancelled
    first = trio.CancelScope()

    async def first_writer() -> None:
        with first:
            await framed.send_raw(_frame(1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_writer)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(framed.send_raw, _frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert [b[0] for b in _frames(stream.wire)] == [1]  # 2 waits for 1, which waits inside send_all
        first.cancel()
    await framed.send_raw(_frame(3))  # and the turn is free again afterwards
    assert [b[0] for b in _frames(stream.wire)] == [1, 2, 3]
    assert first.cancelled_caught


@on_mock_clock
async def test_a_writer_cancelled_while_waiting_leaves_the_queue_without_the_turn():
    stream = PiecemealStream()
    framed = FramedStream(stream)  # type: ignore[arg-type]
    stream.hold[1] = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.send_raw, _frame(1))
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0) as waiting:  # parks behind writer 1, then is cancelled there
            await framed.send_raw(_frame(2))
        assert waiting.cancelled_caught
        nursery.start_soon(framed.send_raw, _frame(3))
        await trio.testing.wait_all_tasks_blocked()
        stream.hold[1].set()
    await framed.send_raw(_frame(4))
    assert [b[0] for b in _frames(stream.wire)] == [1, 3, 4]


@on_mock_clock
async def test_a_writer_whose_send_all_fails_passes_the_turn_on():
    stream = PiecemealStream()
    framed = FramedStream(stream)  # type: ignore[arg-type]
    stream.hold[1] = trio.Event()
    stream.fail[1] = trio.BrokenResourceError("peer gone")
    failed: list[BaseException] = []

    async def first_writer() -> None:
        try:
            await framed.send_raw(_frame(1))
        except trio.BrokenResourceError as exc:
            failed.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_writer)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(framed.send_raw, _frame(2))
        await trio.testing.wait_all_tasks_blocked()
        stream.hold[1].set()
    await framed.send_raw(_frame(3))
    assert len(failed) == 1
    assert [b[0] for b in _frames(stream.wire)] == [1, 2, 3]
