"""A second compiler of our contract's JSON Schema subset: to msgspec types, whose ``convert`` checks a parsed
document in C.

Why: ``fastcheck``'s generated Python is the larger part of what a plugin's answer costs the daemon once parsed:
~1.7 us a machine of a ``listMachines`` page (the whole page read is ~5.5), ~11 us a four-machine poll. Converting
the same document into types derived from the schema takes about a third of that (issue 36).

The derived type accepts only what the schema accepts, for the documents ``runtime.parse_json`` returns (dicts,
lists, ``str``, ``int``, ``float``, ``bool``, ``None``): msgspec's ``convert`` also takes tuples for arrays and any
mapping for objects, so a document built in Python is never given to it. It need not accept everything the schema
does: what it refuses (an ``integer`` written ``1.0``, an integer past 64 bits) goes to ``fastcheck``, whose answer
is then the answer. ``tests/provider/test_schemas.py`` checks the shipped schemas with hypothesis (the derived type
alone never takes what jsonschema refuses, the whole check answers as jsonschema does, and every sample answer
converts without ``fastcheck``); ``tests/provider/test_typedcheck.py`` checks the mapping keyword by keyword.

How a schema maps:

- an object with ``properties`` is a ``Struct`` (its fields renamed to the property names; unknown fields ignored,
  or refused under ``additionalProperties: false``; an optional property defaults to ``UNSET``, so ``null`` is
  only taken where the schema allows it);
- an object without ``properties`` is a ``dict`` (``propertyNames`` on the key, ``additionalProperties`` on the
  value, ``minProperties`` as its length);
- ``string``, ``integer``, ``number``, ``boolean``, ``null``, ``array`` with their bounds as ``Meta``; an ``enum``
  or ``const`` of strings is a ``Literal``; a list of types a union.

A subschema this mapping cannot say exactly (``format``, ``if``/``then``, ``prefixItems``, an ``enum`` that is not
all strings, a union msgspec refuses) is left to ``fastcheck`` where it stands: the enclosing object's field takes
any value, and the ``Struct``'s ``__post_init__`` runs ``fastcheck``'s predicate for that field (msgspec turns its
``ValueError`` into a ``ValidationError``). A schema with no enclosing object for such a node is ``UnsupportedSchema``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union
from urllib.parse import urldefrag, urljoin

import msgspec

from provisionerd.provider.fastcheck import Compiler, Predicate, UnsupportedSchema

#: Keywords that assert nothing (as in ``fastcheck``).
_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "$comment", "examples", "default"})
_STRING = frozenset({"minLength", "maxLength", "pattern"})
_NUMBER = frozenset({"minimum", "maximum"})
_ARRAY = frozenset({"items", "minItems", "maxItems"})
_OBJECT = frozenset({"properties", "required", "additionalProperties", "propertyNames", "minProperties"})
_MAPPED = _STRING | _NUMBER | _ARRAY | _OBJECT | {"type", "enum", "const", "$ref"}


class _Residual(Exception):
    """This node is left to ``fastcheck`` (see the module docstring)."""


def _pointer(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


class TypedCompiler:
    """Derives msgspec types from the schemas of one registry; ``predicate`` gives the check of one schema, built on
    ``fallback`` (``fastcheck``'s compiler over the same documents) for what msgspec refuses."""

    def __init__(self, documents: Mapping[str, Any], fallback: Compiler) -> None:
        self._documents = dict(documents)
        self._fallback = fallback
        self._types: dict[str, Any] = {}  # "url#fragment" -> derived type
        self._deriving: set[str] = set()
        self._names = itertools.count()

    def predicate(self, uri: str) -> Predicate:
        """``valid(document)`` for the schema at ``uri``: the derived type's ``convert`` first, ``fastcheck``'s
        predicate for what that refuses. ``UnsupportedSchema`` when no type can be derived at the top."""
        derived = self.derived(uri)
        slow = self._fallback.compile(uri)
        convert, refused = msgspec.convert, msgspec.ValidationError

        def valid(document: Any) -> bool:
            try:
                convert(document, derived)
            except refused:
                return slow(document)
            return True

        return valid

    def text_predicate(self, uri: str) -> Callable[[str], bool]:
        """``valid(json_text)`` for the schema at ``uri``, by decoding the text into the derived type: only
        JSON's own values reach it, so no precondition on the document that was encoded. False means "not
        shown valid here" (the caller then checks the document itself, for the problems)."""
        decode, refused = msgspec.json.Decoder(self.derived(uri)).decode, msgspec.ValidationError

        def valid(text: str) -> bool:
            try:
                decode(text)
            except refused:
                return False
            return True

        return valid

    def derived(self, uri: str) -> Any:
        """The msgspec type of the schema at ``uri`` (``UnsupportedSchema`` when none can be derived at the top)."""
        url, fragment = urldefrag(uri)
        try:
            derived = self._type(url, fragment)
        except _Residual:
            raise UnsupportedSchema(f"{uri}: no msgspec type says this schema exactly") from None
        try:
            msgspec.json.Decoder(derived)  # msgspec checks the type here (an impossible union is a TypeError)
        except TypeError as exc:
            raise UnsupportedSchema(f"{uri}: msgspec refuses the derived type: {exc}") from None
        return derived

    # --- derivation --------------------------------------------------------------------------------------------

    def _type(self, url: str, fragment: str) -> Any:
        key = f"{url}#{fragment}"
        if key in self._deriving:
            raise _Residual  # a schema that refers to itself: none of ours does, and no msgspec type here says it
        if key not in self._types:
            node = self._documents[url]
            for part in filter(None, fragment.split("/")):
                node = node[part.replace("~1", "/").replace("~0", "~")]
            self._deriving.add(key)
            try:
                self._types[key] = self._node(node, url, fragment)
            finally:
                self._deriving.discard(key)
        return self._types[key]

    def _node(self, schema: Any, url: str, fragment: str) -> Any:
        if schema is True:
            return Any
        if not isinstance(schema, dict) or set(schema) - _ANNOTATIONS - _MAPPED:
            raise _Residual
        if "$ref" in schema:
            if set(schema) - _ANNOTATIONS - {"$ref"}:
                raise _Residual  # a reference beside other keywords: both apply, which no one type says
            target, target_fragment = urldefrag(urljoin(url, schema["$ref"]))
            return self._type(target, target_fragment)
        types = schema.get("type")
        names = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else None
        if "enum" in schema or "const" in schema:
            values = schema["enum"] if "enum" in schema else [schema["const"]]
            if not values or not all(isinstance(v, str) for v in values) or (names and "string" not in names):
                raise _Residual
            if set(schema) & (_STRING | _NUMBER | _ARRAY | _OBJECT) or ("enum" in schema and "const" in schema):
                raise _Residual
            return Literal[tuple(values)]
        if names is None:
            if set(schema) - _ANNOTATIONS:
                raise _Residual  # bounds that apply only to values of some type: no one type says that
            return Any
        members = [self._typed(name, schema, url, fragment) for name in dict.fromkeys(names)]
        return members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007 - built at run time

    def _typed(self, name: str, schema: Mapping[str, Any], url: str, fragment: str) -> Any:
        if name == "string":
            return _bounded(
                str,
                min_length=schema.get("minLength"),
                max_length=schema.get("maxLength"),
                pattern=schema.get("pattern"),
            )
        if name == "integer":
            return _bounded(
                int, ge=_integral(schema.get("minimum"), math.ceil), le=_integral(schema.get("maximum"), math.floor)
            )
        if name == "number":
            return _bounded(float, ge=schema.get("minimum"), le=schema.get("maximum"))
        if name == "boolean":
            return bool
        if name == "null":
            return None
        if name == "array":
            items = self._node(schema.get("items", True), url, f"{fragment}/items")
            bounds = {"min_length": schema.get("minItems"), "max_length": schema.get("maxItems")}
            return _bounded(list[items], **bounds)  # type: ignore[valid-type]
        if name == "object":
            return self._object(schema, url, fragment)
        raise _Residual

    def _object(self, schema: Mapping[str, Any], url: str, fragment: str) -> Any:
        properties: Mapping[str, Any] = schema.get("properties", {})
        required = list(schema.get("required", ()))
        extra = schema.get("additionalProperties", True)
        if not properties and not required and extra is not False:
            keys = self._key(schema.get("propertyNames", True), url, f"{fragment}/propertyNames")
            values = self._node(extra, url, f"{fragment}/additionalProperties")
            return _bounded(dict[keys, values], min_length=schema.get("minProperties"))  # type: ignore[valid-type]
        if extra not in (True, False) or "propertyNames" in schema or "minProperties" in schema:
            raise _Residual
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        rename: dict[str, str] = {}
        residual: dict[str, Predicate] = {}
        for index, prop in enumerate(dict.fromkeys([*properties, *required])):
            field = f"f{index}"
            rename[field] = prop
            where = f"{fragment}/properties/{_pointer(prop)}"
            try:
                kind = self._node(properties.get(prop, True), url, where)
            except _Residual:
                kind, residual[field] = Any, self._fallback.compile(f"{url}#{where}")
            if prop in required:
                fields.append((field, kind))
            else:
                fields.append((field, Union[kind, msgspec.UnsetType], msgspec.UNSET))  # noqa: UP007
        namespace = {"__post_init__": _post_init(residual)} if residual else None
        return msgspec.defstruct(
            f"_T{next(self._names)}",
            fields,
            rename=rename,
            forbid_unknown_fields=extra is False,
            kw_only=True,
            namespace=namespace,
            frozen=True,
            gc=False,
        )

    def _key(self, schema: Any, url: str, fragment: str) -> Any:
        """An object's key type: ``propertyNames`` constrains strings, whatever its ``type`` says."""
        if schema is True:
            return str
        if not isinstance(schema, dict) or set(schema) - _ANNOTATIONS - _STRING - {"type"}:
            raise _Residual
        if schema.get("type", "string") != "string":
            raise _Residual
        return self._typed("string", schema, url, fragment)


def _integral(bound: Any, rounding: Callable[[float], int]) -> int | None:
    """An integer type's bound as an integer (``minimum: 0.5`` is ``ge=1``); None when there is none."""
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
        raise _Residual
    return rounding(bound)


def _bounded(kind: Any, **bounds: Any) -> Any:
    given = {k: v for k, v in bounds.items() if v is not None}
    if not given:
        return kind
    try:
        return Annotated[kind, msgspec.Meta(**given)]
    except (TypeError, ValueError):
        raise _Residual from None  # a bound msgspec cannot say (e.g. a pattern it cannot compile)


def _post_init(residual: Mapping[str, Predicate]) -> Callable[[Any], None]:
    checks = tuple(residual.items())

    def __post_init__(self: Any) -> None:  # noqa: N807 - msgspec's hook
        for field, valid in checks:
            value = getattr(self, field)
            if value is not msgspec.UNSET and not valid(value):
                raise ValueError(f"{field}: refused by the compiled check")

    return __post_init__
