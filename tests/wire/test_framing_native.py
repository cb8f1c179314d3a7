"""FramedStream's native fast path: a whole small frame in hand is checked on its head and decoded in one call
(``codec.decode_framed_native``), and a frame is written header and body at once (``codec.encode_framed_native``).

The fast path only ever answers what the path through ``receive_checked`` and ``decode_metered`` would answer: the
same envelope for a frame it takes, and for anything it refuses (a kind not allowed, a body over its kind's bound,
over the frame limit, malformed) that path's typed error, with no decode before the refusal.

Skipped where the extension is not built (a checkout without Rust), except in CI, which builds it.
"""

from __future__ import annotations

import os
import types
from unittest import mock

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import messages, u64

from provisionerd.domain.errors import FrameOverBounds, FrameTooLarge, OpcodeNotAllowed
from provisionerd.domain.model import CommittedFact, Epoch, InstanceFact
from provisionerd.testing.hostile_frames import list_bomb
from provisionerd.wire import bounds, codec, framing, native
from provisionerd.wire.framing import BufferPool, FramedStream, frame_bytes
from provisionerd.wire.messages import (
    MESSAGE_TYPES,
    AdminStatus,
    Envelope,
    Heartbeat,
    LeaseGrant,
    Message,
    ResyncPage,
)

pytestmark = pytest.mark.skipif(
    native.load() is None and not os.environ.get("CI"), reason="the native codec is not built"
)
ALL_KINDS = frozenset(MESSAGE_TYPES)


def fast() -> tuple[object, type[BaseException]]:
    pair = codec._native_codec()
    assert pair is not None, "CI builds the native codec (pip install builds rust/fastwire with cargo)"
    return pair


class Chunks(trio.abc.ReceiveStream):
    """Hands ``data`` out ``size`` bytes at a time (at most what the reader asks for)."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        n = min(self.size, max_bytes or self.size)
        chunk = self.data[self.at : self.at + n]
        self.at += len(chunk)
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@given(
    frames=st.lists(st.tuples(messages, u64), min_size=1, max_size=6),
    size=st.integers(1, 5000),
    native_on=st.booleans(),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_receive_gives_the_reference_envelopes_at_any_chunk_size_and_the_pool_gets_all_back(frames, size, native_on):
    # Chunks of one frame or several, or cut inside a header or a body: some frames come whole (the fast path,
    # from a chunk of its own or from the buffer), others in pieces (the path through receive_checked). Without
    # the native codec every frame takes the path through receive_checked.
    with mock.patch.object(codec, "_native_codec", codec._native_codec if native_on else lambda: None):
        _receive_all(frames, size)


def _big_page(facts: int) -> Message:
    """A resync page of ``facts`` instance facts (30 of them are above ``framing._VIEW_COPY_FROM``)."""
    epoch = Epoch(3, 17)
    made = tuple(
        CommittedFact(1000 + i, InstanceFact("sim", epoch, "op", f"ref-{i}", f"i-{i:017x}", "c5", "t" * 64, "h", "ip"))
        for i in range(facts)
    )
    return ResyncPage(0, 1, made, (), True, 1000 + facts, 7)


@pytest.mark.sweep
@given(
    facts=st.lists(st.integers(0, 60), max_size=3),
    size=st.sampled_from([1, 7, 4096, 4103, 65536, 1 << 20]),
    native_on=st.booleans(),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_large_frames_copied_out_of_the_buffer_once_are_the_same_envelopes(facts, size, native_on):
    # Bodies above framing._VIEW_COPY_FROM leave the buffer through a memoryview (one copy): the same envelopes as
    # the reference, with the buffer resized after every frame (no view left open on it) and the pool given back.
    frames = [(_big_page(n), i) for i, n in enumerate([30, *facts])]
    assert len(codec.encode_reference(*frames[0])) > framing._VIEW_COPY_FROM
    with mock.patch.object(codec, "_native_codec", codec._native_codec if native_on else lambda: None):
        _receive_all(frames, size)


def _receive_all(frames: list[tuple[Message, int]], size: int) -> None:
    bodies = [codec.encode_reference(msg, corr) for msg, corr in frames]
    data = b"".join(frame_bytes(body) for body in bodies)

    async def main() -> list[Envelope | None]:
        pool = BufferPool(limit=1 << 22)
        framed = FramedStream(Chunks(data, size), pool=pool)  # type: ignore[arg-type]
        got = [await framed.receive(ALL_KINDS, "admin") for _ in bodies]
        assert await framed.receive(ALL_KINDS, "admin") is None  # a clean end between frames
        assert pool.in_use == 0
        return got

    assert trio.run(main) == [codec.decode_reference(body)[0] for body in bodies]


async def test_a_whole_frame_in_hand_is_decoded_by_the_native_path_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reference path is not called at all: the fast path answers (so the tests above exercise it).
    def never(*_: object) -> None:
        raise AssertionError("the reference path was taken")

    monkeypatch.setattr(framing, "decode_metered", never)
    left, right = trio.testing.memory_stream_pair()
    client, server = FramedStream(left), FramedStream(right)  # type: ignore[arg-type]
    await client.send_many([(Heartbeat(1), 1), (Heartbeat(2), 2), (AdminStatus(), 3)])
    got = [await server.receive(ALL_KINDS, "admin") for _ in range(3)]  # one chunk, then the buffer
    assert got == [Envelope(1, Heartbeat(1)), Envelope(2, Heartbeat(2)), Envelope(3, AdminStatus())]


def test_the_native_reader_refuses_a_kind_not_allowed_and_a_body_over_its_kind_s_bound_before_reading_it():
    native_codec, refused = fast()
    bomb = list_bomb("adminSetDemand", ("items",))
    with pytest.raises(refused, match="kind not allowed"):  # a bomb: read, it would be refused on units instead
        native_codec.decode_framed(frame_bytes(bomb), frozenset({Heartbeat}), 1 << 20)  # type: ignore[attr-defined]
    body = codec.encode(Heartbeat(7), 1)
    body += bytes(bounds.SMALL_BODY + 8 - len(body))
    with pytest.raises(refused, match="over its kind's bound"):
        native_codec.decode_framed(frame_bytes(body), ALL_KINDS, 1 << 20)  # type: ignore[attr-defined]
    small = codec.encode(AdminStatus(), 4)
    # the connection's frame limit is lower still: left to the path that refuses it on the header
    assert native_codec.decode_framed(frame_bytes(small), ALL_KINDS, len(small) - 8) is None  # type: ignore[attr-defined]
    framed = frame_bytes(small)
    whole = (*codec.decode_metered(small), len(framed))
    assert codec.decode_framed_native(framed, ALL_KINDS, len(small)) == whole
    # from a buffer holding more than the frame, a bytes or a bytearray: where the frame ends in it
    assert codec.decode_framed_native(framed + b"\0" * 8, ALL_KINDS, len(small)) == whole
    assert codec.decode_framed_native(bytearray(framed + framed), ALL_KINDS, len(small)) == whole
    # not the whole frame in hand, or a header over the frame limit: None, for the path that reads on
    assert codec.decode_framed_native(framed[:-1], ALL_KINDS, len(small)) is None
    assert codec.decode_framed_native(framed[:7], ALL_KINDS, len(small)) is None
    assert codec.decode_framed_native(framed, ALL_KINDS, len(small) - 1) is None


@pytest.mark.parametrize(
    ("body", "allowed", "error"),
    [
        (list_bomb("adminSetDemand", ("items",)), frozenset({Heartbeat}), OpcodeNotAllowed),
        (codec.encode(Heartbeat(7), 1) + bytes(bounds.SMALL_BODY), ALL_KINDS, FrameOverBounds),
    ],
    ids=["not-allowed", "over-bound"],
)
async def test_a_whole_frame_the_native_path_refuses_gets_the_typed_error_and_no_decode(
    monkeypatch: pytest.MonkeyPatch, body: bytes, allowed: frozenset[type], error: type[Exception]
) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(framing, "decode_metered", lambda b: calls.append(b))
    left, right = trio.testing.memory_stream_pair()
    await left.send_all(frame_bytes(body + bytes(-len(body) % 8)))
    with pytest.raises(error):
        await FramedStream(right).receive(allowed, "worker")  # type: ignore[arg-type]
    assert calls == []


@given(msg=messages, corr=u64)
@settings(max_examples=150, deadline=None)
def test_a_frame_is_written_as_the_reference_frames_it(msg: Message, corr: int) -> None:
    reference = codec.encode_reference(msg, corr)
    framed = codec.encode_framed_native(msg, corr, 1 << 20)
    assert framed is not None
    if int.from_bytes(reference[:4], "little") == 0:  # one segment in pycapnp too: the same allocation order
        assert framed == frame_bytes(reference)
    assert codec.decode_reference(framed[8:]) == codec.decode_reference(reference)


async def test_a_frame_over_the_limit_is_refused_and_nothing_is_written() -> None:
    msg = Heartbeat(9)
    size = len(codec.encode(msg, 1))
    assert codec.encode_framed_native(msg, 1, size - 8) is None  # the native writer leaves it to the checks
    left, right = trio.testing.memory_stream_pair()
    with pytest.raises(FrameTooLarge):
        await FramedStream(left, max_frame=size - 8).send(msg, 1)  # type: ignore[arg-type]
    await left.send_all(b"!")
    assert await right.receive_some() == b"!"  # nothing of the refused frame went out


class _Shifted(Epoch):
    """An epoch whose ``seq`` is not its slot's: ``getattr`` finds the property, the class's slot holds another."""

    __slots__ = ()

    @property  # type: ignore[misc]
    def seq(self) -> int:  # type: ignore[override]
        return 99


def test_a_value_of_a_subclass_is_written_as_getattr_reads_it_not_from_its_class_s_slots() -> None:
    # The native writer reads a field through its slot only for a value of the plan's own class.
    epoch = object.__new__(_Shifted)
    for name, value in (("term", 3), ("seq", 17)):
        vars(Epoch)[name].__set__(epoch, value)  # the slots, past the property
    msg = LeaseGrant("sim", epoch, 5000)
    assert codec.decode(codec.encode(msg, 1)).msg.epoch == Epoch(3, 99)
    framed = codec.encode_framed_native(msg, 1, 1 << 20)
    assert framed is not None and codec.decode(framed[8:]).msg == LeaseGrant("sim", Epoch(3, 99), 5000)


async def test_a_frame_over_its_unit_budget_as_it_stands_now_is_left_to_the_reference_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The native codec's plans hold each kind's unit budget of when they were made; the framed reader charges a
    # frame against the budget as ``bounds`` has it at that frame (MAX_UNITS, else DEFAULT_MAX_UNITS), and declines
    # one over it, which the path through decode_metered then refuses with FrameOverBounds.
    page = _big_page(3)
    framed = frame_bytes(codec.encode(page, 4))
    envelope, units = codec.decode_metered(framed[8:])
    assert codec.decode_framed_native(framed, ALL_KINDS, 1 << 20) == (envelope, units, len(framed))
    native_codec, refused = fast()
    for table, default in [({}, units - 1), ({"resyncPage": units - 1}, units + 10)]:
        monkeypatch.setattr(bounds, "MAX_UNITS", table)
        monkeypatch.setattr(bounds, "DEFAULT_MAX_UNITS", default)
        with pytest.raises(refused, match="unit budget"):
            native_codec.decode_framed(framed, ALL_KINDS, 1 << 20)  # type: ignore[attr-defined]
        left, right = trio.testing.memory_stream_pair()
        await left.send_all(framed)
        with pytest.raises(FrameOverBounds, match="decoding budget"):
            await FramedStream(right).receive(ALL_KINDS, "controller")  # type: ignore[arg-type]
    # at the budget exactly, read natively; a budget the native reader cannot read is left to the reference path
    monkeypatch.setattr(bounds, "MAX_UNITS", {"resyncPage": units})
    assert native_codec.decode_framed(framed, ALL_KINDS, 1 << 20) == (envelope, units, len(framed))  # type: ignore[attr-defined]
    monkeypatch.setattr(bounds, "MAX_UNITS", types.MappingProxyType({"resyncPage": units - 1}))
    with pytest.raises(refused, match="not a dict"):
        native_codec.decode_framed(framed, ALL_KINDS, 1 << 20)  # type: ignore[attr-defined]
    assert codec.decode_framed_native(framed, ALL_KINDS, 1 << 20) is None
    monkeypatch.delattr(bounds, "DEFAULT_MAX_UNITS")
    monkeypatch.setattr(bounds, "MAX_UNITS", {})
    assert codec.decode_framed_native(framed, ALL_KINDS, 1 << 20) is None
