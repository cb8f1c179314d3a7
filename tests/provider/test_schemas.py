"""The contract's schemas: samples of every action validate, mistakes are caught with paths, and the compiled
fast checker agrees with jsonschema on every document hypothesis can think of."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisionerd.provider.fastcheck import Compiler, UnsupportedSchema, json_equal
from provisionerd.provider.runtime import dump_json, parse_json
from provisionerd.provider.schemas import ACTIONS, ContractSchemas, contract, is_rfc3339
from provisionerd.provider.typedcheck import TypedCompiler

TAGS = {
    "provisionerd:cluster": "c1",
    "provisionerd:provider": "sim",
    "provisionerd:op": "op-1",
    "provisionerd:epoch": "3.14",
}
MACHINE = {
    "machineId": "i-1",
    "name": "host-1",
    "result": "succeed",
    "status": "running",
    "privateIpAddress": None,
    "launchtime": 1700000000,
    "message": "",
    "instanceRef": "ref-1",
    "tags": dict(TAGS, **{"provisionerd:instance": "ref-1"}),
}
SAMPLES = {
    "describeProvider": (
        {},
        {
            "name": "sim",
            "version": "1",
            "contractVersion": 1,
            "features": {
                "idempotentRequest": True,
                "listMachines": True,
                "stopMachines": False,
                "tags": True,
                "priceQuotes": True,
            },
        },
    ),
    "getAvailableTemplates": (
        {},
        {
            "templates": [
                {
                    "templateId": "t",
                    "maxNumber": 3,
                    "attributes": {
                        "type": ["String", "X86_64"],
                        "ncpus": ["Numeric", "8"],
                        "fast": ["Boolean", "true"],
                    },
                    "price": {
                        "amount": 0.34,
                        "currency": "USD",
                        "unit": "hour",
                        "source": "list",
                        "timestamp": "2024-02-29T23:59:60.5+01:00",
                    },
                }
            ]
        },
    ),
    "requestMachines": (
        {
            "template": {"templateId": "t", "machineCount": 1},
            "rc_account": "default",
            "userData": {"a": 1},
            "op_id": "op-1",
            "tags": TAGS,
            "bootstrap": [{"instanceRef": "ref-1", "controllers": ["ctl:7700"], "joinToken": "0123456789abcdef"}],
        },
        {"requestId": "req-1", "message": ""},
    ),
    "getRequestStatus": (
        {"requests": [{"requestId": "req-1"}]},
        {"requests": [{"requestId": "req-1", "status": "complete", "message": "", "machines": [MACHINE]}]},
    ),
    "requestReturnMachines": (
        {"machines": [{"name": "host-1", "machineId": "i-1"}], "op_id": "op-1", "tags": TAGS},
        {"requestId": "ret-1"},
    ),
    "stopMachines": (
        {"machines": [{"name": "host-1", "machineId": "i-1"}], "op_id": "op-1", "tags": TAGS},
        {"requestId": "stop-1", "message": "ok"},
    ),
    "getReturnRequests": (
        {"machines": []},
        {
            "status": "complete",
            "message": "",
            "requests": [{"machine": "host-1", "machineId": "i-1", "gracePeriod": 120}],
        },
    ),
    "listMachines": (
        {"tags": {"provisionerd:cluster": "c1"}},
        {
            "machines": [
                {k: MACHINE[k] for k in ("machineId", "name", "status", "launchtime", "privateIpAddress", "tags")}
            ]
        },
    ),
    "listLicenses": (
        {"tags": {"provisionerd:cluster": "c1"}, "pageSize": 10},
        {"licenses": [{"pool": "matlab", "granted": 3, "inUse": 1, "checkedOut": 1700000000}], "nextCursor": None},
    ),
    "returnLicenses": (
        {"op_id": "op-1", "tags": TAGS, "licenses": [{"pool": "matlab", "count": 2}]},
        {"requestId": "lic-1"},
    ),
}
PRICE = SAMPLES["getAvailableTemplates"][1]["templates"][0]["price"]
ERROR = {"error": {"code": "throttled", "message": "slow down", "retryable": True}}


def test_every_action_has_samples_that_validate():
    assert set(SAMPLES) == set(ACTIONS)
    schemas = contract()
    for action, (inp, out) in SAMPLES.items():
        assert schemas.input_problems(action, inp) == [], action
        assert schemas.output_problems(action, out) == [], action
    assert schemas.error_problems(ERROR) == []


@pytest.mark.parametrize(
    ("action", "kind", "mutate", "path"),
    [
        (
            "getRequestStatus",
            "output",
            lambda d: d["requests"][0]["machines"][0].update(launchtime="1"),
            "$.requests[0].machines[0].launchtime",
        ),
        ("getRequestStatus", "output", lambda d: d["requests"][0].update(status="done"), "$.requests[0].status"),
        (
            "getAvailableTemplates",
            "output",
            lambda d: d["templates"][0]["attributes"].update(ncpus=["Numeric", "x"]),
            "$.templates[0].attributes.ncpus",
        ),
        (
            "getAvailableTemplates",
            "output",
            lambda d: d["templates"][0]["price"].update(timestamp="2024-02-30T00:00:00Z"),
            "$.templates[0].price.timestamp",
        ),
        ("describeProvider", "output", lambda d: d.update(contractVersion=True), "$.contractVersion"),
        ("requestMachines", "input", lambda d: d.update(op_id="has space"), "$.op_id"),
        ("requestMachines", "input", lambda d: d.update(extra=1), "$"),
        ("requestMachines", "input", lambda d: d["template"].update(machineCount=2), "$.bootstrap"),
        ("requestMachines", "input", lambda d: d["tags"].update({"provisionerd:op": "other"}), "$.tags"),
        ("listMachines", "input", lambda d: d.update(tags={"x": "y"}), "$.tags"),
    ],
)
def test_mistakes_are_reported_with_their_path(action, kind, mutate, path):
    doc = copy.deepcopy(SAMPLES[action][0 if kind == "input" else 1])
    mutate(doc)
    problems = getattr(contract(), f"{kind}_problems")(action, doc)
    assert problems and any(p.startswith(path) for p in problems), problems


def test_rfc3339():
    assert is_rfc3339("2024-01-01T00:00:00Z") and is_rfc3339("2024-01-01t00:00:00.123+05:30")
    for bad in ("2024-01-01", "2024-13-01T00:00:00Z", "2024-01-01T00:00:00", "yesterday", "2024-01-01T00:00:00Z\n"):
        assert not is_rfc3339(bad), bad


def test_the_fast_checker_refuses_keywords_it_does_not_know():
    compiler = Compiler({"urn:x": {"$id": "urn:x", "type": "object", "patternProperties": {"a": {}}}}, {})
    with pytest.raises(UnsupportedSchema):
        compiler.compile("urn:x")


def test_json_equal():
    assert json_equal(1, 1.0) and not json_equal(True, 1) and not json_equal(0, False)
    assert json_equal({"a": [1, "x"]}, {"a": [1.0, "x"]}) and not json_equal([1], [1, 2])


# --- the fast checker agrees with jsonschema ---------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        [
            "",
            "x",
            "8",
            "-1.5",
            "1e3",
            "USD",
            "usd",
            "hour",
            "String",
            "Numeric",
            "Boolean",
            "complete",
            "succeed",
            "1.2",
            "op-1",
            "bad op",
            "host:1",
            "2024-01-01T00:00:00Z",
            "2024-02-30T00:00:00Z",
            "provisionerd:cluster",
            "x" * 70,
            "a\n",
            # at and past the bounds where a code point is not a byte (msgspec and jsonschema count code points)
            "\U0001f600" * 64,
            "\U0001f600" * 65,
            "\u00e9" * 128,
            "\u00e9" * 129,
        ]
    ),
    st.sampled_from([2**63, 2**64, 2**70, -(2**63) - 1, 1.0, -0.0, 1e300]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated(draw, kinds=("in", "out")):
    name = draw(st.sampled_from(sorted(f"{a}.{k}put.json" for a in ACTIONS for k in kinds)))
    action, kind = name.split(".")[:2]
    doc = copy.deepcopy(SAMPLES[action][0 if kind == "input" else 1])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            doc = draw(JSON)
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "replace" or isinstance(parent, list) and op == "add":
            parent[path[-1]] = draw(JSON)
        elif op == "delete":
            del parent[path[-1]]
        else:
            parent[draw(st.sampled_from(["extra", "name", "tags", "price", "provisionerd:op"]))] = draw(JSON)
    return name, doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fast_checker_agrees_with_jsonschema(case):
    name, doc = case
    schemas: ContractSchemas = contract()
    slow = schemas.validator(name).is_valid(doc)
    fast = schemas._fast[name](doc)
    assert fast == slow, (name, json.dumps(doc)[:500])


# --- the typed check (msgspec types derived from the schemas) agrees too, on what a transport parsed ----------


def _typed() -> TypedCompiler:
    documents = {d["$id"]: d for d in contract().documents.values()}
    return TypedCompiler(documents, Compiler(documents, {"date-time": is_rfc3339}))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(kinds=("out",)))
def test_the_typed_check_agrees_with_jsonschema_on_parsed_outputs(case):
    name, doc = case
    doc = parse_json(json.dumps(doc))  # what a transport checks: only dicts, lists and JSON's scalars
    schemas: ContractSchemas = contract()
    valid = schemas.validator(name).is_valid(doc)
    assert (schemas.output_violations(name.split(".")[0], doc, parsed=True) == []) == valid, json.dumps(doc)[:500]
    # The derived type alone never takes what the schema refuses (what it refuses, fastcheck then decides).
    try:
        msgspec.convert(doc, _typed().derived(schemas.documents[name]["$id"]))
    except msgspec.ValidationError:
        return
    assert valid, (name, json.dumps(doc)[:500])


@pytest.mark.parametrize("action", sorted(SAMPLES))
def test_the_typed_check_takes_the_samples_itself(action):
    """The speed-up is real only if a plugin's usual answer never needs fastcheck: every sample output converts."""
    name = f"{action}.output.json"
    doc = parse_json(json.dumps(SAMPLES[action][1]))
    msgspec.convert(doc, _typed().derived(contract().documents[name]["$id"]))


@pytest.mark.parametrize(
    "action, mutate",
    [
        # a field left to fastcheck inside a typed object: the price's date-time, an attribute's if/then
        ("getRequestStatus", lambda d: d["requests"][0]["machines"][0].update(price=dict(PRICE, timestamp="x"))),
        ("getAvailableTemplates", lambda d: d["templates"][0]["attributes"].update(ncpus=["Numeric", "eight"])),
        ("listMachines", lambda d: d["machines"][0]["tags"].update({"k" * 129: "v"})),
        ("listMachines", lambda d: d["machines"][0].update(privateIpAddress="\U0001f600" * 65)),
        ("listMachines", lambda d: d["machines"][0].update(launchtime=True)),
    ],
)
def test_the_typed_check_refuses_what_the_schema_refuses(action, mutate):
    doc = parse_json(json.dumps(SAMPLES[action][1]))
    mutate(doc)
    assert contract().output_violations(action, doc, parsed=True) == contract().output_violations(action, doc)
    assert contract().output_violations(action, doc, parsed=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(kinds=("in",)))
def test_an_input_checked_as_its_text_agrees_with_jsonschema_on_that_text(case):
    """A persistent call checks the text it sends (``encoded``): the schema holds for that text exactly when the
    derived type decodes it, else the document's own check decides."""
    name, doc = case
    action = name.split(".")[0]
    try:
        text = dump_json(doc)
    except ValueError:
        return
    sent = parse_json(text)
    problems = contract().input_problems(action, doc, encoded=text)
    assert problems == contract().input_problems(action, sent), json.dumps(doc)[:500]
    typed = contract()._encoded.get(name)  # requestMachines has none: fastcheck cannot say exclusiveMinimum
    if typed is not None and typed(text):
        assert contract().validator(name).is_valid(sent)


def test_an_input_shown_valid_as_text_still_has_its_semantics_checked():
    document, _ = copy.deepcopy(SAMPLES["stopMachines"])
    document["op_id"] = "op-2"  # not the op tag's
    text = dump_json(document)
    assert contract()._encoded["stopMachines.input.json"](text)
    assert contract().input_problems("stopMachines", document, encoded=text) == [
        "$.tags['provisionerd:op']: must equal $.op_id"
    ]
