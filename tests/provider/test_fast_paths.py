"""The provider read path's fast paths give what the full paths give, for any input (issue 36, items 3 and 4).

Each fast path takes only the common shape and hands everything else to the full path, so the only way it can be
wrong is to answer differently on a shape it does take: these properties compare the two on arbitrary input,
valid or not, and on near-valid documents made from real answers.
"""

from __future__ import annotations

import datetime
import json
from enum import IntEnum
from types import MappingProxyType

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisionerd.domain.errors import ProviderAnswerInvalid
from provisionerd.domain.model import TAG_INSTANCE
from provisionerd.provider import contract
from provisionerd.provider.persistent import request_line
from provisionerd.provider.runtime import _DECODER, _ENCODER, dump_json, parse_json
from provisionerd.provider.schemas import ACTIONS
from provisionerd.provider.values import RequestStatus

PROPERTIES = settings(max_examples=400, deadline=None)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["", "succeed", "i-1", "10.0.0.1", TAG_INSTANCE, "NaN"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


def _outcome(fn, *args):
    """What ``fn`` returns, or the type and text of what it raises."""
    try:
        return ("value", fn(*args))
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc), str(exc))


# --- parse_json: msgspec for what it takes, the standard decoder for anything else ---------------------------------

TEXTS = st.one_of(
    JSON.map(json.dumps),
    JSON.map(lambda v: json.dumps(v, separators=(",", ":"))),
    st.tuples(JSON.map(json.dumps), st.sampled_from(["", " ", "\n", "\t ", " x", "1", "{}", ",", "\r\n"])).map(
        lambda p: p[0] + p[1]
    ),
    st.tuples(st.sampled_from(["", " ", "\n", "x"]), JSON.map(json.dumps)).map(lambda p: p[0] + p[1]),
    st.sampled_from(["", " ", "NaN", "-Infinity", "[NaN]", '{"a": Infinity}', "nul", "{", '{"a":1', "[1,]", "01"]),
    st.text(max_size=12),
)


@PROPERTIES
@given(TEXTS)
def test_parse_json_answers_as_the_decoder_does(text):
    fast, full = _outcome(parse_json, text), _outcome(_DECODER.decode, text)
    assert fast[0] == full[0]
    if fast[0] == "error":  # the same exception, with the same text (position included)
        assert fast[1:] == full[1:]
    else:  # equal and of the same types all the way down (1 is not 1.0, True is not 1)
        assert json.dumps(fast[1]) == json.dumps(full[1])
    assert (
        _outcome(parse_json, text.encode("utf-8", "surrogatepass")) == fast
        or fast[0] == "error"
        or any("\ud800" <= c <= "\udfff" for c in text)
    )


EDGES = [
    b"18446744073709551616",  # past 64 bits: an int, not a double, whichever decoder reads it
    b"-9223372036854775809",
    b"1e400",  # the standard decoder reads infinity; msgspec refuses it
    b"1e-400",
    b'"\\ud800"',  # a lone surrogate escape: the standard decoder takes it
    b'"\\ud83d\\ude00"',
    b'"\xed\xa0\x80"',  # an encoded surrogate: not UTF-8
    b'{"a":1,"a":2}',  # the later key wins
    b'"a\tb"',  # a raw control character
    b"\r\n1\r\n",
    b"1\x00",
    b"\xef\xbb\xbf1",  # a byte order mark
    b"-0",
    b"-0.0",
    b"1E2",
    b"[1 , 2]",
    b"5.",
    b"01",
]


@pytest.mark.parametrize("raw", EDGES)
def test_parse_json_answers_as_the_decoder_does_at_the_edges(raw):
    def full(data):
        return _DECODER.decode(data.decode("utf-8"))

    fast, slow = _outcome(parse_json, raw), _outcome(full, raw)
    assert fast[0] == slow[0]
    if fast[0] == "error":  # the same exception, with the same text
        assert fast[1:] == slow[1:]
    else:  # the same value, of the same types all the way down
        assert json.dumps(fast[1]) == json.dumps(slow[1])
        assert type(fast[1]) is type(slow[1])


# --- status_machine: no conversion on the shape a validated answer has -----------------------------------------

TAG_MAPS = st.one_of(
    st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=4),
    st.dictionaries(st.sampled_from([TAG_INSTANCE, "a", "b"]), st.sampled_from(["", "ref-1", "x"]), max_size=3),
    JSON,
)
FIELDS = {
    "machineId": st.one_of(st.text(max_size=6), SCALARS),
    "name": st.one_of(st.text(max_size=6), SCALARS),
    "result": st.one_of(st.sampled_from(["executing", "succeed", "fail"]), SCALARS),
    "status": st.one_of(st.text(max_size=6), SCALARS),
    "privateIpAddress": st.one_of(st.none(), st.text(max_size=6), SCALARS),
    "launchtime": st.one_of(st.integers(0, 2**40), SCALARS),
    "instanceRef": st.one_of(st.sampled_from(["", "ref-0", "bench-1"]), SCALARS),
    "message": SCALARS,
    "tags": TAG_MAPS,
}
ENTRIES = st.fixed_dictionaries({}, optional=FIELDS)


def _read(fn, entry):
    """The value ``fn`` reads (as its repr: NaN is not equal to itself, and the types show), or what it raises."""
    try:
        return ("value", repr(fn(entry)))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        return ("error", type(exc))


@PROPERTIES
@given(ENTRIES)
def test_a_status_machine_reads_the_same_on_either_path(entry):
    full = _read(contract._status_machine_read, entry)
    assert _read(contract.status_machine, entry) == full
    plain = contract._status_machine_plain(entry)
    if plain is not None:  # taken: the very value the full reader makes, its tags a copy of their own
        assert full == ("value", repr(plain))
        assert plain.tags is not entry.get("tags")
        assert [type(v) for v in plain.tags.values()] == [str] * len(plain.tags)
        assert type(plain.launch_time) is float


def test_the_plain_path_takes_what_plugins_answer():
    entry = {
        "machineId": "i-1",
        "name": "ip-10-0-0-1",
        "result": "succeed",
        "status": "running",
        "privateIpAddress": "10.0.0.1",
        "launchtime": 1796492209,
        "message": "",
        "tags": {TAG_INSTANCE: "bench-0", "provisionerd:op": "op-1"},
    }
    machine = contract._status_machine_plain(entry)
    assert machine is not None and machine.instance_ref == "bench-0" and machine.launch_time == 1796492209.0
    assert contract._status_machine_plain({**entry, "privateIpAddress": None}) is not None
    assert contract._status_machine_plain({**entry, "launchtime": 1.5}) is None  # the full reader reads it


# --- listed_machine: the same for a listing's machines (issue 36, item 3) ---------------------------------------


@PROPERTIES
@given(ENTRIES)
def test_a_listed_machine_reads_the_same_on_either_path(entry):
    full = _read(contract._listed_machine_read, entry)
    assert _read(contract.listed_machine, entry) == full
    plain = contract._listed_machine_plain(entry)
    if plain is not None:  # taken: the very value the full reader makes, its tags a copy of their own
        assert full == ("value", repr(plain))
        assert plain.tags is not entry.get("tags")
        assert [type(v) for v in plain.tags.values()] == [str] * len(plain.tags)
        assert type(plain.launch_time) is float


#: Entries of the shape a validated listing has, each field now and then of another shape (ENTRIES alone almost
#: never makes a whole page of the usual shape: 1 in ~2,000).
LISTED_ENTRIES = st.fixed_dictionaries(
    {
        "machineId": st.text(max_size=6),
        "launchtime": st.one_of(st.integers(0, 2**40), st.integers(2**60, 2**70)),
        "tags": st.dictionaries(st.sampled_from([TAG_INSTANCE, "a", "b"]), st.text(max_size=4), max_size=3),
    },
    optional={
        "name": st.text(max_size=6),
        "status": st.text(max_size=6),
        "privateIpAddress": st.one_of(st.none(), st.text(max_size=6)),
        "instanceRef": st.one_of(st.none(), st.sampled_from(["", "ref-0"])),
    },
)
PAGES = st.lists(st.one_of(LISTED_ENTRIES, LISTED_ENTRIES, LISTED_ENTRIES, ENTRIES), max_size=4) | st.lists(
    LISTED_ENTRIES, max_size=4
)


@PROPERTIES
@given(PAGES)
def test_a_listing_page_reads_the_same_converted_at_once_or_entry_by_entry(entries):
    """``read_machines`` converts a page of the usual shape into rows at once: the same machines as reading each
    entry (``listed_machine``), or the same refusal. The page goes through JSON first, as a transport's does."""
    try:
        page = parse_json(dump_json({"machines": entries}))
    except ValueError:
        return  # NaN or an infinity: never a plugin's answer
    by_entry = _read(lambda d: tuple(contract.listed_machine(m) for m in d["machines"]), page)
    try:
        rows = contract.read_machines("p", page)
    except ProviderAnswerInvalid:
        whole: tuple[str, ...] = ("refused",)
    else:
        whole = ("value", repr(tuple(row.machine() for row in rows)))
        # What the classifier reads of a row is what its machine says, the launch time a float as a machine's is.
        for row, machine in zip(rows, (row.machine() for row in rows), strict=True):
            assert type(row.launch_time) is float
            assert (row.machine_id, row.name, row.status, row.launch_time, row.address, row.instance_ref) == (
                machine.machine_id,
                machine.name,
                machine.status,
                machine.launch_time,
                machine.address,
                machine.instance_ref,
            )
            assert row.tags == machine.tags
    assert whole == by_entry or (whole == ("refused",) and by_entry[0] == "error")


POLLED_ENTRIES = st.fixed_dictionaries(
    {"machineId": st.text(max_size=6)},
    optional={
        "name": st.one_of(st.none(), st.text(max_size=6)),
        "result": st.sampled_from(["executing", "succeed", "fail"]),
        "status": st.one_of(st.none(), st.text(max_size=6)),
        "privateIpAddress": st.one_of(st.none(), st.text(max_size=6)),
        "instanceRef": st.one_of(st.none(), st.sampled_from(["", "ref-0"])),
        "launchtime": st.one_of(st.none(), st.integers(0, 2**40), st.integers(2**60, 2**70)),
        "message": st.text(max_size=3),
        "tags": st.dictionaries(st.sampled_from([TAG_INSTANCE, "a", "b"]), st.text(max_size=4), max_size=3),
    },
)
REQUESTS = st.fixed_dictionaries(
    {"requestId": st.text(max_size=4), "status": st.sampled_from(["running", "complete"])},
    optional={
        "message": st.one_of(st.none(), st.text(max_size=3)),
        "machines": st.lists(st.one_of(POLLED_ENTRIES, POLLED_ENTRIES, POLLED_ENTRIES, ENTRIES), max_size=3),
    },
)


def _statuses_by_entry(document):
    return tuple(
        RequestStatus(
            str(entry["requestId"]),
            str(entry["status"]),
            str(entry.get("message") or ""),
            tuple(contract.status_machine(m) for m in entry.get("machines", ())),
        )
        for entry in document["requests"]
    )


@PROPERTIES
@given(st.lists(REQUESTS, max_size=3), st.sampled_from([None, "price", "instanceType"]))
def test_a_status_answer_reads_the_same_converted_at_once_or_entry_by_entry(requests, said):
    """``read_statuses`` converts an answer of the usual shape at once: the same statuses as reading each entry,
    or the same refusal. A machine that says its price or type sends the whole answer entry by entry."""
    if said and requests and requests[0].get("machines"):
        requests[0]["machines"][0][said] = {"amount": 1, "currency": "USD"} if said == "price" else "m5.large"
    try:
        document = parse_json(dump_json({"requests": requests}))
    except ValueError:
        return
    by_entry = _read(_statuses_by_entry, document)
    try:
        whole = ("value", repr(contract.read_statuses("p", document)))
    except ProviderAnswerInvalid:
        whole = ("refused",)
    assert whole == by_entry or (whole == ("refused",) and by_entry[0] == "error")


def test_a_launch_time_past_a_float_is_a_refused_answer_not_a_crash():
    """The schema bounds ``launchtime`` only below: 400 digits are valid JSON and a valid answer's shape, and no
    float. The reader refuses the answer (typed), whichever path reads it."""
    entry = {"machineId": "i-1", "name": "", "status": "running", "launchtime": 10**400, "tags": {}}
    for document in ({"machines": [entry]}, {"machines": [entry, {**entry, "launchtime": 1.5}]}):
        with pytest.raises(ProviderAnswerInvalid, match="OverflowError"):
            contract.read_machines("p", document)
    status = {"requestId": "r", "status": "complete", "machines": [{"machineId": "i-1", "launchtime": 10**400}]}
    with pytest.raises(ProviderAnswerInvalid, match="OverflowError"):
        contract.read_statuses("p", {"requests": [status]})


def test_the_plain_path_takes_what_a_listing_holds():
    entry = {
        "machineId": "i-1",
        "name": "ip-10-0-0-1",
        "status": "running",
        "launchtime": 1796492209,
        "privateIpAddress": "10.0.0.1",
        "tags": {TAG_INSTANCE: "bench-0", "provisionerd:op": "op-1"},
    }
    machine = contract._listed_machine_plain(entry)
    assert machine is not None and machine.instance_ref == "bench-0" and machine.result == "succeed"
    assert contract._listed_machine_plain({**entry, "privateIpAddress": None}) is not None
    assert contract._listed_machine_plain({**entry, "tags": {}, "instanceRef": "ref-1"}).instance_ref == "ref-1"
    assert contract._listed_machine_plain({**entry, "launchtime": 1.5}) is None  # the full reader reads it


# --- dump_json: msgspec's text where it is the standard encoder's, the standard encoder otherwise -------------------


class _Sub(str):
    pass


@attrs.frozen
class _Value:
    a: int = 1


NOT_JSON = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -float("inf"), b"x", bytearray(b"y"), _Value(), _Sub("s")]),
    st.sampled_from([IntEnum("E", "one two").one, MappingProxyType({"a": 1}), datetime.date(2026, 1, 1)]),
    st.frozensets(st.integers(0, 3), max_size=2),
    st.integers(2**63, 2**80),
    st.text(alphabet='é\u2028\ud800\x7f\x00"', max_size=3),
)
VALUES = st.recursive(
    st.one_of(SCALARS, NOT_JSON),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=2).map(tuple)
        | st.dictionaries(
            st.one_of(st.text(max_size=4), st.integers(0, 3), st.booleans(), st.none()), inner, max_size=3
        )
    ),
    max_leaves=8,
)


def _floats_in(value: object) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, (list, tuple)):
        return any(_floats_in(v) for v in value)
    if isinstance(value, dict):
        return any(_floats_in(k) or _floats_in(v) for k, v in value.items())
    return False


@PROPERTIES
@given(VALUES)
def test_dump_json_writes_what_the_standard_encoder_writes_or_refuses_as_it_does(value):
    try:
        standard: tuple[object, ...] = ("value", _ENCODER.encode(value))
    except (TypeError, ValueError, RecursionError) as exc:
        standard = ("error", type(exc))
    try:
        ours: tuple[object, ...] = ("value", dump_json(value))
    except (TypeError, ValueError, RecursionError) as exc:
        ours = ("error", type(exc))
    if standard[0] == "error" or _floats_in(value):
        # A number may be spelt otherwise (1e16 for 1e+16), never valued otherwise.
        assert ours[0] == standard[0]
        if ours[0] == "value":
            assert json.loads(ours[1]) == json.loads(standard[1]) and ours[1].isascii()
        else:
            assert ours == standard
    else:
        assert ours == standard


def test_dump_json_refuses_what_msgspec_alone_would_write():
    for value in ({"a": float("nan")}, {"a": {1, 2}}, {"a": b"x"}, {"a": _Value()}, [datetime.date(2026, 1, 1)]):
        with pytest.raises((TypeError, ValueError)):
            dump_json(value)
    assert dump_json({"a": (1, 2), 3: "é"}) == '{"a":[1,2],"3":"\\u00e9"}'


# --- request_line: only the input goes through the encoder ----------------------------------------------------


@PROPERTIES
@given(st.integers(1, 2**63), st.sampled_from(sorted(ACTIONS)), st.dictionaries(st.text(max_size=4), JSON, max_size=3))
def test_a_request_line_is_the_dict_s_compact_json(ident, action, document):
    try:
        expected = (dump_json({"id": ident, "action": action, "input": document}) + "\n").encode()
    except ValueError:  # NaN or an infinity: not JSON, refused either way
        return
    assert request_line(ident, action, dump_json(document)) == expected


# --- _reading: a class with the generator's behaviour ------------------------------------------------------------


def test_reading_turns_only_reader_errors_into_an_answer_refusal_without_their_context():
    for raised, what in ((KeyError("requestId"), "key 'requestId' missing"), (TypeError("secret 'x'"), "TypeError")):
        with pytest.raises(ProviderAnswerInvalid) as caught, contract._reading("p", "getRequestStatus"):
            raise raised
        assert caught.value.problems == (("$", f"readable: {what}"),)
        assert caught.value.__suppress_context__ and caught.value.__cause__ is None
    with pytest.raises(ZeroDivisionError), contract._reading("p", "getRequestStatus"):  # not a reader's: as it is
        raise ZeroDivisionError
    with contract._reading("p", "getRequestStatus"):
        pass
