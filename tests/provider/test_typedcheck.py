"""The msgspec types derived from a schema (provisionerd.provider.typedcheck): what each keyword becomes, what is
left to fastcheck, and what no type can say. The shipped schemas' agreement with jsonschema is tested in
test_schemas.py; these are the small cases that document the mapping."""

from __future__ import annotations

import json

import msgspec
import pytest

from provisionerd.provider.fastcheck import Compiler, UnsupportedSchema
from provisionerd.provider.runtime import parse_json
from provisionerd.provider.typedcheck import TypedCompiler

ID = "https://t.invalid/s.json"


def compiled(schema):
    documents = {ID: {"$id": ID, **schema}}
    return TypedCompiler(documents, Compiler(documents, {}))


def taken(schema, text):
    """(the derived type took it, the predicate's answer) for a JSON text."""
    typed = compiled(schema)
    doc = parse_json(text)
    try:
        msgspec.convert(doc, typed.derived(ID))
        converted = True
    except msgspec.ValidationError:
        converted = False
    return converted, typed.predicate(ID)(doc)


OBJECT = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0.5},
        "s": {"type": ["string", "null"], "maxLength": 2},
        "e": {"enum": ["a", "b"]},
        "m": {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": {"minLength": 2}},
    },
    "required": ["n"],
}


@pytest.mark.parametrize(
    "text, converted, valid",
    [
        ('{"n": 1}', True, True),
        ('{"n": 0}', False, False),  # minimum 0.5 on an integer is ge=1
        ('{"n": 1.0}', False, True),  # an integer written 1.0: msgspec refuses, fastcheck takes it
        ('{"n": 18446744073709551617}', True, True),
        ('{"n": true}', False, False),
        ("{}", False, False),
        ('{"n": 1, "s": null, "other": [1, {"x": null}]}', True, True),  # unknown properties are anything
        ('{"n": 1, "s": "\U0001f600\U0001f600"}', True, True),  # lengths in code points, not bytes
        ('{"n": 1, "s": "abc"}', False, False),
        ('{"n": 1, "e": "c"}', False, False),
        ('{"n": 1, "e": null}', False, False),  # an optional property is absent, never null unless allowed
        ('{"n": 1, "m": {"ab": "x"}}', True, True),
        ('{"n": 1, "m": {"a": "x"}}', False, False),
        ('{"n": 1, "m": {"ab": 1}}', False, False),
    ],
)
def test_what_an_object_schema_takes(text, converted, valid):
    assert taken(OBJECT, text) == (converted, valid)


def test_additional_properties_false_refuses_an_unknown_one():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    assert taken(schema, '{"a": "x"}') == (True, True)
    assert taken(schema, '{"a": "x", "b": 1}') == (False, False)
    empty = {"type": "object", "additionalProperties": False, "properties": {}}  # describeProvider's input
    assert taken(empty, "{}") == (True, True)
    assert taken(empty, '{"a": 1}') == (False, False)


def test_a_field_no_type_says_is_left_to_fastcheck_inside_its_object():
    schema = {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date-time"}, "k": {"enum": [1, "one"]}},
    }
    documents = {ID: {"$id": ID, **schema}}
    typed = TypedCompiler(documents, Compiler(documents, {"date-time": lambda s: s.startswith("20")}))
    valid = typed.predicate(ID)
    assert valid(parse_json('{"when": "2024", "k": 1}'))
    assert not valid(parse_json('{"when": "1999"}'))
    assert not valid(parse_json('{"k": 2}'))
    with pytest.raises(msgspec.ValidationError, match="refused by the compiled check"):
        msgspec.convert(parse_json('{"when": "1999"}'), typed.derived(ID))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "date-time"},  # a residual node with no object around it
        {"$ref": "#", "type": "object"},  # a reference beside other keywords
        {"minLength": 1},  # a bound with no type
    ],
)
def test_what_no_type_can_say_is_unsupported_at_the_top(schema):
    with pytest.raises(UnsupportedSchema):
        compiled(schema).derived(ID)


def test_a_schema_that_refers_to_itself_is_left_to_fastcheck_where_it_does():
    schema = {"type": "object", "properties": {"self": {"$ref": "#"}, "n": {"type": "integer"}}}
    assert taken(schema, '{"n": 1, "self": {"self": {}}}') == (True, True)
    assert taken(schema, '{"self": {"self": {"n": "x"}}}') == (False, False)


def test_an_array_and_its_bounds():
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}
    for text, valid in (("[1]", True), ("[]", False), ("[1, 2, 3]", False), ('["1"]', False), ("[1.0]", True)):
        assert compiled(schema).predicate(ID)(json.loads(text)) is valid
