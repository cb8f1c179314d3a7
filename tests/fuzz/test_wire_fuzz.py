"""Fuzzing the wire parsers: ``FramedStream.receive`` and ``decode`` on arbitrary bytes.

Whatever a peer sends, the reader gets a decoded envelope, ``None`` (clean EOF) or a ``ProtocolError`` (the typed
error that drops the peer) — nothing else escapes — and memory stays bounded by one frame.
"""

from __future__ import annotations

import struct
import tracemalloc

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisionerd.domain.errors import FrameTooLarge, ProtocolError
from provisionerd.domain.model import Role
from provisionerd.wire.codec import decode, encode
from provisionerd.wire.framing import FramedStream, frame_bytes
from provisionerd.wire.messages import Envelope, Heartbeat, Join

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class ChunkStream(trio.abc.ReceiveStream):
    """Hands out ``data`` in the given chunk sizes, then EOF."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.offset = 0  # no copies of the rest: the memory measured is the reader's
        self.sizes = sizes or [len(data) or 1]
        self.i = 0

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.lowlevel.checkpoint()
        size = self.sizes[self.i % len(self.sizes)]
        self.i += 1
        if max_bytes is not None:
            size = min(size, max_bytes)
        chunk = self.data[self.offset : self.offset + size]
        self.offset += len(chunk)
        return chunk

    async def aclose(self) -> None:
        pass


def read_all(data: bytes, sizes: list[int], max_frame: int = 1 << 16) -> list[object]:
    """Every frame the reader gets from ``data``: envelopes, then ``None`` or the error that stopped it."""

    async def main():
        framed = FramedStream(ChunkStream(data, sizes), max_frame)  # type: ignore[arg-type]
        out: list[object] = []
        while True:
            try:
                envelope = await framed.receive()
            except ProtocolError as exc:
                out.append(exc)
                return out
            out.append(envelope)
            if envelope is None:
                return out

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


valid_frame = st.sampled_from(
    [
        frame_bytes(encode(Heartbeat(7), 3)),
        frame_bytes(encode(Join(role=Role.PROVISIONER, identity="p", protocol_version=1, providers=("sim",)), 1)),
    ]
)
garbage = st.binary(max_size=400)
# A header announcing a length, then a body of arbitrary bytes (more realistic than pure noise).
framed_garbage = st.builds(
    lambda n, body: struct.pack("<Q", n) + body,
    st.one_of(st.integers(0, 600), st.integers(0, 2**64 - 1)),
    st.binary(max_size=600),
)


@FUZZ
@given(
    st.lists(st.one_of(garbage, framed_garbage, valid_frame), max_size=5).map(b"".join),
    st.lists(st.integers(1, 700), max_size=4),
)
def test_the_frame_reader_returns_envelopes_none_or_a_protocol_error(data, sizes):
    out = read_all(data, sizes)
    assert all(isinstance(x, Envelope) for x in out[:-1])
    assert out[-1] is None or isinstance(out[-1], (Envelope, ProtocolError))


@FUZZ
@given(st.binary(max_size=2000))
def test_decode_raises_only_protocol_errors(body):
    try:
        envelope = decode(body)
    except ProtocolError:
        return
    assert isinstance(envelope, Envelope)


@FUZZ
@given(valid_frame, st.integers(0, 60), st.binary(min_size=1, max_size=8))
def test_a_corrupted_valid_frame_is_decoded_or_refused(frame, at, flip):
    position = min(at, len(frame) - 1)
    corrupted = (
        frame[:position]
        + bytes(b ^ f for b, f in zip(frame[position:], flip, strict=False))
        + frame[position + len(flip) :]
    )
    out = read_all(corrupted, [])
    assert out[-1] is None or isinstance(out[-1], (Envelope, ProtocolError))


def test_a_huge_announced_frame_costs_no_memory():
    tracemalloc.start()
    try:
        out = read_all(struct.pack("<Q", 2**62) + b"x" * 100_000, [65536], max_frame=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(out[-1], FrameTooLarge)
    assert peak < 2 << 20


def test_a_long_stream_of_frames_is_read_in_bounded_memory():
    data = frame_bytes(encode(Heartbeat(7), 3)) * 20_000  # ~600 KB of valid frames

    async def main():
        framed = FramedStream(ChunkStream(data, [65536]), 1 << 16)  # type: ignore[arg-type]
        count = 0
        while await framed.receive() is not None:
            count += 1
        return count

    tracemalloc.start()
    try:
        count = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 20_000
    assert peak < 300_000  # a read chunk and a frame at a time, never the whole input
