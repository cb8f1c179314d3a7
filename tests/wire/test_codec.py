"""encode/decode: every message kind round trips, and no byte string makes decode raise anything but DecodeError."""

from __future__ import annotations

import struct

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import FACT_STRATEGIES, MESSAGE_STRATEGIES, messages, u64

from provisionerd.domain import model
from provisionerd.domain.errors import DecodeError
from provisionerd.wire import codec
from provisionerd.wire import messages as m


def test_strategies_cover_every_message_and_fact_kind():
    assert set(MESSAGE_STRATEGIES) == set(m.MESSAGE_TYPES)
    assert set(FACT_STRATEGIES) == set(model.FACT_TYPES)


@given(msg=messages, corr=u64)
@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
def test_every_message_round_trips(msg, corr):
    assert codec.decode(codec.encode(msg, corr)) == m.Envelope(corr, msg)


@pytest.mark.parametrize("kind", sorted(MESSAGE_STRATEGIES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_each_kind_round_trips(kind):
    # One focused run per kind so a failure names the kind, whatever hypothesis' one_of happened to favour.
    @given(MESSAGE_STRATEGIES[kind])
    @settings(max_examples=25)
    def check(msg):
        assert codec.decode(codec.encode(msg)).msg == msg

    check()


def test_optional_and_map_fields_keep_none_empty_and_order_free_equality():
    shape = model.ResourceShape(gpu_type=None, arch="", attributes={"b": "2", "a": "1"})
    item = model.DemandItem("d", shape, 2, max_hourly_cost=None, placement={})
    got = codec.decode(codec.encode(m.AdminSetDemand([item]))).msg.items[0]
    assert got.shape.gpu_type is None and got.shape.arch == "" and got.max_hourly_cost is None
    assert got.shape.attributes == {"a": "1", "b": "2"}
    priced = codec.decode(codec.encode(m.AdminSetDemand([attrs.evolve(item, max_hourly_cost=0.0)]))).msg
    assert priced.items[0].max_hourly_cost == 0.0


def test_the_join_token_never_shows_in_repr():
    join = m.Join(model.Role.WORKER, "w1", instance_ref="i-1", token="s3cret-token")
    assert "s3cret" not in repr(join)
    assert codec.decode(codec.encode(join)).msg.token == "s3cret-token"


def test_opcode_names_the_union_member():
    assert codec.opcode(m.LeaseAcquire("p")) == "leaseAcquire"
    assert codec.opcode(m.ErrorMsg) == "errorMsg"


@pytest.mark.parametrize(
    "bad",
    [
        m.Heartbeat(-1),
        m.Heartbeat(2**64),
        m.AdminFailover(2**31),
        m.LeaseAcquire("\ud800"),  # a lone surrogate has no UTF-8 form
    ],
    ids=["negative", "too-big", "int32-overflow", "surrogate"],
)
def test_encode_refuses_values_that_do_not_fit_with_value_error(bad):
    with pytest.raises(ValueError, match="cannot encode"):
        codec.encode(bad)


def test_encode_refuses_non_messages_and_non_facts():
    with pytest.raises(TypeError):
        codec.encode(model.Epoch(1, 2))
    with pytest.raises(TypeError):
        codec.encode(m.FactCommit(model.Epoch(1, 2)))


def test_codes_are_checked_when_a_message_is_built():
    with pytest.raises(ValueError):
        m.ErrorMsg("no_such_code")
    with pytest.raises(ValueError):
        m.Rejected("nope")


# --- hostile bodies --------------------------------------------------------------------------------------------


def _decode_or_decode_error(body: bytes) -> None:
    try:
        env = codec.decode(body)
    except DecodeError:
        return
    assert isinstance(env.msg, m.MESSAGE_TYPES)


@given(st.binary(max_size=600))
@settings(max_examples=700)
def test_arbitrary_bytes_raise_only_decode_error(body):
    _decode_or_decode_error(body)


@given(st.binary(min_size=1, max_size=80).map(lambda b: b + bytes(-len(b) % 8)))
@settings(max_examples=700)
def test_arbitrary_word_aligned_bytes_raise_only_decode_error(body):
    # Word-aligned input gets past the length check into the capnp reader proper.
    _decode_or_decode_error(body)


@given(msg=messages, data=st.data())
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_valid_bodies_raise_only_decode_error(msg, data):
    # Flipping bytes of a real message reaches deep paths: bad pointers, unknown enumerants and union members,
    # invalid UTF-8, overlapping lists.
    body = bytearray(codec.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    _decode_or_decode_error(bytes(body))


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00" * 7, b"\x00" * 8, b"\xff" * 64, struct.pack("<II", 0x7FFFFFFF, 1) + bytes(8)],
    ids=["empty", "unaligned", "no-segment", "all-ones", "huge-segment-count"],
)
def test_known_bad_bodies(body):
    with pytest.raises(DecodeError):
        codec.decode(body)


def _list_pointer_words(body: bytes) -> list[int]:
    words = [struct.unpack_from("<Q", body, i)[0] for i in range(8, len(body), 8)]
    return [i for i, w in enumerate(words) if w & 3 == 1 and (w >> 32) & 7 == 7]


def test_a_list_of_empty_structs_with_a_huge_count_hits_the_traversal_limit():
    # 2**29 - 1 zero-sized elements cost no bytes; without the limit decoding would build half a billion items.
    body = bytearray(codec.encode(m.AdminSetDemand([model.DemandItem("d", model.ResourceShape(), 1)])))
    word = _list_pointer_words(bytes(body))[0]
    struct.pack_into("<Q", body, 8 + 8 * word, 1 | ((2**29 - 1) << 35))  # void list, offset 0
    with pytest.raises(DecodeError, match="traversal limit"):
        codec.decode(bytes(body))


def test_an_unknown_enumerant_is_a_decode_error():
    body = bytearray(codec.encode(m.ErrorMsg("internal", "")))
    code_at = body.rfind(struct.pack("<H", 5))  # internal = 5, the only non-zero data in ErrorMsg
    body[code_at] = 99
    with pytest.raises(DecodeError, match="unknown enum"):
        codec.decode(bytes(body))


def test_a_duplicate_map_key_is_a_decode_error():
    shape = model.ResourceShape(attributes={"zone": "a", "zonf": "b"})
    body = codec.encode(m.AdminSetDemand([model.DemandItem("d", shape, 1)]))
    with pytest.raises(DecodeError, match="duplicate key"):
        codec.decode(body.replace(b"zonf", b"zone"))


@pytest.mark.parametrize("decode", [codec.decode, lambda body: codec.decode_reference(body)[0]], ids=["native", "ref"])
def test_decoded_maps_share_their_keys_and_values_across_values(decode):
    # A push of many hosts repeats a few capability names and values: each is held once, whichever path decodes.
    caps = {"ncpus": "8", "type": "c5.2xlarge"}
    hosts = tuple(
        model.HostState(f"ref-{n}", "sim", f"i-{n}", model.HostStatus.IDLE, 1.0, capabilities=dict(caps))
        for n in (1, 2)
    )
    first, second = decode(codec.encode(m.HostStatePush(hosts, 1))).msg.hosts
    assert first == hosts[0] and second == hosts[1]
    for (k1, v1), (k2, v2) in zip(first.capabilities.items(), second.capabilities.items(), strict=True):
        assert k1 is k2 and v1 is v2


def test_interned_fields_decode_to_their_own_text_past_any_cache_and_share_a_repeated_one():
    # Far more distinct op ids than the native reader keeps interned texts of (colliding slots included), and each
    # one twice: every fact gets its own text back, and both facts of an op hold one string.
    epoch = model.Epoch(1, 1)
    facts = tuple(
        model.CommittedFact(n, model.Returned("sim", epoch, f"op-{n // 2:04d}", (f"i-{n}",), 1.0)) for n in range(1000)
    )
    got = codec.decode(codec.encode(m.ResyncPage(0, 1, facts[:500], (), True, 500, 0))).msg.facts
    got += codec.decode(codec.encode(m.ResyncPage(0, 1, facts[500:], (), True, 1000, 0))).msg.facts
    assert got == facts
    assert all(got[n].fact.op_id is got[n + 1].fact.op_id for n in range(0, 1000, 2))
