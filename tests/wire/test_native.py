"""The native codec (rust/fastwire) against the reference path (pycapnp): same bytes, same values, same units.

The native codec only ever answers for the reference: a body it does not read, or a value it does not write, goes
to the reference path, which decides. So the one thing it must never do is accept what the reference refuses, or
read or write something else than the reference does. These tests look for exactly that, on every message kind
(hypothesis), on bodies spread over several segments, and on hostile bodies (the reference's own bytes mutated).

Skipped where the extension is not built (a checkout without Rust), except in CI, which builds it.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import messages, u64

from provisionerd.domain import model
from provisionerd.domain.errors import DecodeError
from provisionerd.wire import codec, native
from provisionerd.wire import messages as m

BUILT = native.load() is not None
pytestmark = pytest.mark.skipif(not BUILT and not os.environ.get("CI"), reason="the native codec is not built")
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fast() -> tuple[object, type[BaseException]]:
    pair = codec._native_codec()
    assert pair is not None, "CI builds the native codec (pip install builds rust/fastwire with cargo)"
    return pair


def segments(body: bytes) -> int:
    return struct.unpack_from("<I", body)[0] + 1


def handed_back() -> int:
    return codec.NATIVE_HANDED_BACK[0]


@given(msg=messages, corr=u64)
@SLOW
def test_native_writes_the_reference_bytes_and_reads_the_reference_values(msg, corr):
    native_codec, _ = fast()
    before = handed_back()
    reference = codec.encode_reference(msg, corr)
    ours = native_codec.encode(msg, corr)  # type: ignore[attr-defined]
    if segments(reference) == 1:  # pycapnp's first segment holds it: allocation order is the same
        assert ours == reference
    assert segments(ours) == 1
    expected = codec.decode_reference(reference)
    assert expected[0] == m.Envelope(corr, msg)
    assert native_codec.decode(reference, codec._traversal_words(reference)) == expected  # type: ignore[attr-defined]
    assert codec.decode_reference(ours) == expected
    assert codec.decode_metered(ours) == expected
    assert handed_back() == before


def _facts(n: int) -> m.ResyncPage:
    facts = []
    for i in range(n):
        fact = model.InstanceFact(
            "sim", model.Epoch(3, 7), f"op-{i // 10}", f"ref-{i}", f"i-{i:017x}", "c5.large", "ab" * 32, f"h{i}"
        )
        facts.append(model.CommittedFact(1000 + i, fact))
    return m.ResyncPage(0, 1, tuple(facts), (), True, 1000 + n, 1)


def test_a_body_over_several_segments_reads_through_its_far_pointers():
    native_codec, _ = fast()
    page = _facts(400)
    reference = codec.encode_reference(page, 9)
    assert segments(reference) > 1  # pycapnp's writer spilled into more segments: far pointers and landing pads
    before = handed_back()
    expected = codec.decode_reference(reference)
    assert native_codec.decode(reference, codec._traversal_words(reference)) == expected  # type: ignore[attr-defined]
    ours = codec.encode(page, 9)
    assert segments(ours) == 1 and codec.decode_reference(ours) == expected
    assert handed_back() == before


def test_shared_text_fields_come_back_as_one_string():
    envelope = codec.decode(codec.encode(_facts(20)))
    providers = {id(committed.fact.provider) for committed in envelope.msg.facts}
    ops = {id(committed.fact.op_id) for committed in envelope.msg.facts}
    assert len(providers) == 1 and len(ops) == 2
    # small values (scalars and texts, no validators) decoded once per distinct bytes, equal to the reference's
    epochs = {id(committed.fact.epoch) for committed in envelope.msg.facts}
    prices = {id(committed.fact.price) for committed in envelope.msg.facts}
    assert len(epochs) == 1 and len(prices) == 1
    assert envelope == codec.decode_reference(codec.encode_reference(_facts(20)))[0]


def test_distinct_small_values_stay_distinct_past_the_memo_s_size():
    # more distinct epochs than the memo holds (4096 slots, direct-mapped: a key whose slot holds another replaces
    # it): each decodes to its own value, over pages of at most 500 facts (the list cap), twice round
    for _ in range(2):
        for first in range(0, 5000, 500):
            facts = tuple(
                model.CommittedFact(i, model.RequestIntent("p", model.Epoch(i, i + 1), f"op{i}", "t", 1, (), ()))
                for i in range(first, first + 500)
            )
            got = codec.decode(codec.encode(m.ResyncPage(0, 1, facts, (), True, 5000, 1))).msg
            assert [f.fact.epoch for f in got.facts] == [model.Epoch(i, i + 1) for i in range(first, first + 500)]


def test_small_values_that_differ_only_in_a_text_are_not_shared():
    quotes = [model.PriceQuote(0.1, currency, "hour", "", "") for currency in ("USD", "EUR", "", "USD\x00")]
    facts = tuple(
        model.CommittedFact(i, attrs.evolve(_facts(1).facts[0].fact, price=quote)) for i, quote in enumerate(quotes)
    )
    page = m.ResyncPage(0, 1, facts, (), True, 4, 1)
    for _ in range(2):
        assert [f.fact.price for f in codec.decode(codec.encode(page)).msg.facts] == quotes


def _same(a, b) -> bool:
    """Equal values, a NaN read from the body included (a mutated float field may read as NaN, on both paths:
    NaN is never == NaN, its repr is the same)."""
    return a == b or repr(a) == repr(b)


def _outcome(decode, body):
    try:
        return decode(body)
    except DecodeError as exc:
        return type(exc), str(exc)


@given(
    msg=messages,
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.integers(0, 64),
)
@SLOW
def test_a_hostile_body_is_never_read_otherwise_than_the_reference_reads_it(msg, edits, cut):
    native_codec, refused = fast()
    body = bytearray(codec.encode_reference(msg, 5))
    for position, value in edits:
        body[position % len(body)] = value
    mutated = bytes(body[: max(8, len(body) - 8 * (cut // 8))])
    reference = _outcome(codec.decode_reference, mutated)
    try:
        ours = native_codec.decode(mutated, codec._traversal_words(mutated))  # type: ignore[attr-defined]
    except (refused, DecodeError, *codec._MALFORMED):
        pass  # handed back: the reference decides
    else:
        assert _same(ours, reference)  # it read it: then the reference reads the same value (never an error)
    assert _same(_outcome(codec.decode_metered, mutated), reference)  # what the daemon gets: the reference's answer


VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"


def _vector_bodies() -> list[bytes]:
    return [bytes.fromhex(json.loads(p.read_text())["body_hex"]) for p in sorted(VECTORS.glob("*.json"))]


def test_every_single_byte_change_of_every_vector_reads_as_the_reference_reads_it():
    # Exhaustive where the random edits above are thin: each byte of each vector body set to 0, 1, 0xff and its
    # own value with the top bit flipped (pointer kinds and offsets, list sizes, text terminators, segment table).
    native_codec, refused = fast()
    bodies = _vector_bodies()
    assert len(bodies) >= 30
    read = 0
    for body in bodies:
        for position in range(len(body)):
            for value in {0, 1, 0xFF, body[position] ^ 0x80}:
                mutated = body[:position] + bytes([value]) + body[position + 1 :]
                reference = _outcome(codec.decode_reference, mutated)
                try:
                    ours = native_codec.decode(mutated, codec._traversal_words(mutated))  # type: ignore[attr-defined]
                except (refused, DecodeError, *codec._MALFORMED):
                    continue
                read += 1
                assert ours == reference, (body.hex(), position, value)
    assert read > 1000  # most single-byte changes still read (data fields, text bytes): the check has teeth


@pytest.mark.parametrize(
    "bad",
    [
        m.Heartbeat(-1),  # a negative UInt64
        m.Heartbeat(2**64),  # too large
        m.LeaseAcquire("\ud800"),  # a lone surrogate: not UTF-8
    ],
    ids=["negative", "too-large", "surrogate"],
)
def test_a_value_the_wire_cannot_carry_is_refused_as_the_reference_refuses_it(bad):
    with pytest.raises(ValueError) as reference:
        codec.encode_reference(bad)
    before = handed_back()
    with pytest.raises(ValueError) as ours:
        codec.encode(bad)
    assert str(ours.value) == str(reference.value)
    assert handed_back() == before + 1


def test_a_field_of_the_wrong_type_is_refused_as_the_reference_refuses_it():
    wrong = attrs.evolve(m.LeaseAcquire("p"), provider=7)  # attrs does not check types: the codec must
    with pytest.raises((TypeError, ValueError)) as reference:
        codec.encode_reference(wrong)
    with pytest.raises(type(reference.value)):
        codec.encode(wrong)


def test_the_build_is_of_these_sources():
    module = importlib.import_module("provisionerd.wire._fastwire")
    assert module.PLAN_VERSION == native.PLAN_VERSION


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(native.SWITCH, "0")
    assert native.load() is None
    monkeypatch.delenv(native.SWITCH)
    assert native.load() is not None


@attrs.frozen
class _Plain:
    a: int
    b: tuple[str, ...] = attrs.field(converter=tuple)


@attrs.frozen
class _Validated:
    a: int = attrs.field(validator=attrs.validators.instance_of(int))


@attrs.frozen
class _Converted:
    a: tuple[str, ...] = attrs.field(converter=lambda v: tuple(sorted(v)))


@attrs.frozen
class _PostInit:
    a: int

    def __attrs_post_init__(self) -> None:
        pass


@attrs.define
class _Mutable:
    a: int


def test_a_value_is_made_without_its_init_only_when_the_init_would_only_store_it():
    assert codec._stores_only(_Plain)
    for cls in (_Validated, _Converted, _PostInit, _Mutable):
        assert not codec._stores_only(cls), cls.__name__
    # and what the rule lets through decodes as the reference decodes it (every kind: the hypothesis test above)
    assert codec._stores_only(model.InstanceFact) and not codec._stores_only(m.ErrorMsg)


def test_every_field_read_through_its_slot_is_found_in_the_value_itself() -> None:
    # The plans' classes are attrs classes with slots: the native codec confirms where each slot sits in a value
    # (from its descriptor, checked by identity) and reads and writes it there, not through the descriptor's calls.
    native_codec, _ = fast()
    plans = native_codec.slot_offsets()  # type: ignore[attr-defined]
    assert any(cls is model.InstanceFact for cls, _, _ in plans)
    assert plans[-1][:2] == (m.Envelope, True)  # the envelope's corr and msg, stored at their offsets
    for cls, slots, offsets in plans:
        if slots:
            assert all(offsets), cls.__name__
            assert len(set(offsets)) == len(offsets), cls.__name__


def test_a_value_with_a_field_never_set_is_refused_as_the_reference_refuses_it() -> None:
    # made without its __init__: its slot holds nothing, and reading it is getattr's AttributeError on either path
    empty = object.__new__(m.LeaseAcquire)
    with pytest.raises(AttributeError, match="provider"):
        codec.encode_reference(empty)
    with pytest.raises(AttributeError, match="provider"):
        codec.encode(empty)
    epoch = object.__new__(model.Epoch)
    object.__setattr__(epoch, "term", 3)
    fact = model.InstanceFact("p", epoch, "op", "ref", "m", "t", "h")
    page = m.ResyncPage(0, 1, (model.CommittedFact(1, fact),), (), True, 1, 0)
    with pytest.raises(AttributeError, match="seq"):
        codec.encode_reference(page)
    with pytest.raises(AttributeError, match="seq"):
        codec.encode(page)


@given(frames=st.lists(st.tuples(messages, u64), max_size=5))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_many_frames_written_in_one_call_are_each_frame_written_alone(frames):
    # encode_framed_many writes every frame into one buffer (kept from call to call), each with its header and
    # its segment table: the same bytes as encode_framed of each, joined, and the body as encode writes it
    native_codec, _ = fast()
    alone = [native_codec.encode_framed(msg, corr, 1 << 20) for msg, corr in frames]  # type: ignore[attr-defined]
    assert native_codec.encode_framed_many(list(frames), 1 << 20) == b"".join(alone)  # type: ignore[attr-defined]
    for (msg, corr), framed in zip(frames, alone, strict=True):
        assert framed[8:] == native_codec.encode(msg, corr) == codec.encode(msg, corr)  # type: ignore[attr-defined]
        assert int.from_bytes(framed[:8], "little") == len(framed) - 8


def test_a_frame_refused_part_way_leaves_nothing_in_the_next_one():
    # a refusal (a value out of range, a body over the limit, not a pair) after frames written into the kept
    # buffer, and a body larger than the buffer keeps: the next call writes its own frames alone
    native_codec, refused = fast()
    page = _facts(3)
    expected = native_codec.encode_framed(page, 5, 1 << 20)  # type: ignore[attr-defined]
    big = _facts(400)  # about 170 KiB: a buffer larger than the one kept (64 KiB)
    for items, limit in [
        ([(page, 5), (m.Heartbeat(2**64), 1)], 1 << 20),
        ([(page, 5), (big, 6)], 1 << 16),
        ([(page, 5), (page,)], 1 << 20),
        ([(page, 5), page], 1 << 20),
        ([(page, 5), (page, -1)], 1 << 20),
    ]:
        with pytest.raises(refused):
            native_codec.encode_framed_many(items, limit)  # type: ignore[attr-defined]
        assert native_codec.encode_framed(page, 5, 1 << 20) == expected  # type: ignore[attr-defined]
    assert codec.decode(native_codec.encode(big, 6)) == m.Envelope(6, big)  # type: ignore[attr-defined]
    assert native_codec.encode_framed_many([(page, 5)], 1 << 20) == expected  # type: ignore[attr-defined]
    assert native_codec.encode_framed_many([], 1 << 20) == b""  # type: ignore[attr-defined]


class _Text(str):
    pass


class _Count(int):
    pass


class _Index:
    """Not an int, but one to ``operator.index`` (the reference writer takes it)."""

    def __index__(self) -> int:
        return 7


class _Ratio(float):
    pass


@pytest.mark.parametrize(
    ("msg", "plain"),
    [
        (m.LeaseAcquire(_Text("aws")), m.LeaseAcquire("aws")),
        (m.Heartbeat(_Count(5)), m.Heartbeat(5)),
        (m.Heartbeat(_Index()), m.Heartbeat(7)),  # type: ignore[arg-type]
        (m.Heartbeat(True), m.Heartbeat(1)),
        (m.FactAck(_Count(43), _Ratio(1765000002.5)), m.FactAck(43, 1765000002.5)),
        (m.FactAck(43, 1765000002), m.FactAck(43, 1765000002.0)),  # type: ignore[arg-type]
    ],
    ids=["str-subclass", "int-subclass", "index", "bool-for-int", "float-subclasses", "int-for-float"],
)
def test_a_scalar_of_a_subclass_or_another_type_is_written_as_the_plain_value(msg, plain):
    # Exact str, int, float and bool are written borrowed from their slot; anything else the long way, through a
    # reference of its own, to the same bytes as before: those of the plain value. (The reference writer refuses
    # some of these, an int subclass or a bool for an integer, which the native writer has always written.)
    native_codec, _ = fast()
    expected = codec.encode_reference(plain, 3)
    assert native_codec.encode(msg, 3) == expected  # type: ignore[attr-defined]
    assert native_codec.encode_framed_many([(msg, 3)], 1 << 20) == len(expected).to_bytes(8, "little") + expected  # type: ignore[attr-defined]


def test_texts_read_from_their_pointer_word_equal_the_reference_s():
    # a text whose pointer is a near pointer to a list of bytes is read straight from the pointer word
    # (``Msg::text_bytes``); texts of every length around a word's edge, empty ones and shared ones among them
    texts = ["", "a", "x" * 7, "y" * 8, "z" * 9, "é" * 4, "w" * 63, "v" * 64, "u" * 65, "t" * 300]
    facts = []
    for i, text in enumerate(texts):
        fact = model.InstanceFact(text, model.Epoch(1, i), text, text, text, text, text, text, text)
        facts.append(model.CommittedFact(i, fact))
    page = m.ResyncPage(0, 1, tuple(facts), (), True, len(texts), 1)
    before = handed_back()
    for body in (codec.encode(page, 3), codec.encode_reference(page, 3)):
        assert codec.decode_metered(body) == codec.decode_reference(body)
    assert handed_back() == before
