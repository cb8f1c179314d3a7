"""FramedStream: round trips at any split, coalesced writes, one writer at a time, and the refusals that bound
memory (oversize header before any body byte, truncation)."""

from __future__ import annotations

from itertools import pairwise

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import messages, u64

from provisionerd.domain.errors import DecodeError, FrameTooLarge, TruncatedFrame
from provisionerd.wire import codec
from provisionerd.wire import messages as m
from provisionerd.wire.framing import HEADER_SIZE, FramedStream, frame_bytes


class ScriptedStream(trio.abc.Stream):
    """Hands out ``chunks`` in order (never more than asked for), then EOF, or ``after`` if given.

    ``after`` is an exception to raise when read past the script: it proves the reader stopped where it should.
    """

    def __init__(self, chunks: list[bytes], after: BaseException | None = None) -> None:
        self.chunks = [c for c in chunks if c]
        self.after = after
        self.handed_out = 0
        self.requests: list[int] = []
        self.writes: list[bytes] = []

    async def receive_some(self, max_bytes=None):
        await trio.lowlevel.checkpoint()
        self.requests.append(max_bytes)
        if not self.chunks:
            if self.after is not None:
                raise self.after
            return b""
        chunk = self.chunks.pop(0)
        if max_bytes is not None and len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            self.chunks.insert(0, rest)
        self.handed_out += len(chunk)
        return chunk

    async def send_all(self, data):
        await trio.lowlevel.checkpoint()
        self.writes.append(bytes(data))

    async def wait_send_all_might_not_block(self):
        await trio.lowlevel.checkpoint()

    async def aclose(self):
        await trio.lowlevel.checkpoint()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in pairwise(points)]


@given(
    frames=st.lists(st.tuples(messages, u64), max_size=6),
    cuts=st.lists(st.integers(0, 10**6), max_size=12),
)
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_frames_split_at_arbitrary_byte_boundaries_round_trip(frames, cuts):
    data = b"".join(frame_bytes(codec.encode(msg, corr)) for msg, corr in frames)
    stream = ScriptedStream(_split(data, cuts))

    async def main():
        framed = FramedStream(stream)
        got = [await framed.receive() for _ in frames]
        assert await framed.receive() is None
        return got

    assert trio.run(main) == [m.Envelope(corr, msg) for msg, corr in frames]


@given(frames=st.lists(st.tuples(messages, u64), min_size=1, max_size=6))
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip_over_a_memory_stream_pair_with_a_concurrent_reader(frames):
    async def main():
        left, right = trio.testing.memory_stream_pair()
        sender, receiver = FramedStream(left), FramedStream(right)
        got = []

        async def read_all():
            while (env := await receiver.receive()) is not None:
                got.append(env)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            for msg, corr in frames[:1]:
                await sender.send(msg, corr)
            await sender.send_many(frames[1:])
            await left.send_eof()
        return got

    assert trio.run(main) == [m.Envelope(corr, msg) for msg, corr in frames]


async def test_send_many_is_one_write_and_checks_every_frame_first():
    stream = ScriptedStream([])
    framed = FramedStream(stream, max_frame=200)
    await framed.send_many([(m.Heartbeat(1), 1), (m.Ack(), 2), (m.FactAck(3), 3)])
    assert len(stream.writes) == 1
    with pytest.raises(FrameTooLarge):
        await framed.send_many([(m.Heartbeat(1), 1), (m.AdminReply(True, "x" * 500), 2)])
    assert len(stream.writes) == 1  # nothing of the refused batch went out
    await framed.send_many([])
    assert len(stream.writes) == 1


async def test_concurrent_senders_are_serialized():
    # A memory stream raises BusyResourceError on overlapping send_all, as a real socket stream does.
    left, right = trio.testing.memory_stream_pair()
    sender, receiver = FramedStream(left), FramedStream(right)
    per_task = 40

    async def spam(task):
        for i in range(per_task):
            await sender.send(m.Heartbeat(i), corr=task)

    got = []
    async with trio.open_nursery() as nursery:
        for task in (1, 2, 3):
            nursery.start_soon(spam, task)

        async def read():
            while len(got) < 3 * per_task:
                got.append(await receiver.receive())

        nursery.start_soon(read)
    for task in (1, 2, 3):
        assert [e.msg.seq for e in got if e.corr == task] == list(range(per_task))


async def test_oversize_header_is_refused_before_any_body_byte_is_read():
    header = (1025).to_bytes(8, "little")
    stream = ScriptedStream([header], after=AssertionError("read past an oversize header"))
    with pytest.raises(FrameTooLarge) as info:
        await FramedStream(stream, max_frame=1024).receive()
    assert (info.value.length, info.value.limit) == (1025, 1024)
    assert stream.handed_out == HEADER_SIZE


async def test_a_header_near_two_to_the_64_is_refused():
    stream = ScriptedStream([b"\xff" * 8], after=AssertionError("read past an oversize header"))
    with pytest.raises(FrameTooLarge):
        await FramedStream(stream).receive()


async def test_a_frame_exactly_at_the_limit_is_accepted():
    body = codec.encode(m.AdminReply(True, "x" * 100))
    framed = FramedStream(ScriptedStream([frame_bytes(body)]), max_frame=len(body))
    assert (await framed.receive()).msg == m.AdminReply(True, "x" * 100)


async def test_sending_a_frame_over_the_limit_raises_and_writes_nothing():
    stream = ScriptedStream([])
    with pytest.raises(FrameTooLarge):
        await FramedStream(stream, max_frame=64).send(m.AdminReply(True, "x" * 100))
    assert stream.writes == []


@pytest.mark.parametrize("cut", [1, 7], ids=["1-byte", "7-bytes"])
async def test_truncated_header(cut):
    data = frame_bytes(codec.encode(m.Heartbeat(5)))
    with pytest.raises(TruncatedFrame, match="header"):
        await FramedStream(ScriptedStream([data[:cut]])).receive()


@pytest.mark.parametrize("missing", [1, 8], ids=["last-byte", "last-word"])
async def test_truncated_body(missing):
    data = frame_bytes(codec.encode(m.Heartbeat(5)))
    with pytest.raises(TruncatedFrame, match="body"):
        await FramedStream(ScriptedStream([data[:-missing]])).receive()


async def test_a_truncated_second_frame_after_a_good_one():
    one = frame_bytes(codec.encode(m.Heartbeat(1)))
    framed = FramedStream(ScriptedStream([one + one[:12]]))
    assert (await framed.receive()).msg == m.Heartbeat(1)
    with pytest.raises(TruncatedFrame):
        await framed.receive()


async def test_a_garbage_body_is_a_decode_error_and_the_next_frame_still_reads():
    good = frame_bytes(codec.encode(m.Heartbeat(2)))
    framed = FramedStream(ScriptedStream([frame_bytes(b"\xff" * 16) + good]))
    with pytest.raises(DecodeError):
        await framed.receive()
    assert (await framed.receive()).msg == m.Heartbeat(2)


async def test_zero_length_body_is_a_decode_error():
    with pytest.raises(DecodeError):
        await FramedStream(ScriptedStream([bytes(8)])).receive()


async def test_the_buffer_never_holds_more_than_one_max_frame():
    # The peer floods frames faster than we consume them; what we have read but not yet consumed stays within one
    # header + max_frame whatever the transport would hand us.
    max_frame = 4096
    bodies = [codec.encode(m.AdminReply(True, "y" * n)) for n in (10, 4000, 3000, 50, 4000, 1)]
    flood = b"".join(frame_bytes(b) for b in bodies)
    stream = ScriptedStream([flood])
    framed = FramedStream(stream, max_frame=max_frame)
    consumed = 0
    for body in bodies:
        env = await framed.receive()
        assert codec.encode(env.msg) == body
        assert stream.handed_out - consumed <= HEADER_SIZE + max_frame
        consumed += HEADER_SIZE + len(body)
    assert max(stream.requests) <= HEADER_SIZE + max_frame
    assert await framed.receive() is None


def test_max_frame_must_hold_a_message():
    with pytest.raises(ValueError):
        FramedStream(ScriptedStream([]), max_frame=4)
