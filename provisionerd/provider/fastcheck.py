"""A compiler from our contract's JSON Schema subset to generated Python predicates.

Why: jsonschema with ``$ref``s through ``referencing`` costs ~4.5 ms for a ten-machine ``getRequestStatus`` output
on this machine, which alone would cap the persistent transport near 200 calls/s. This module turns each schema
node into one plain Python function (generated source, ``exec``'d once) that answers only "valid or not", tens of
times faster. When a predicate says "not valid", the caller asks jsonschema for the precise problems, so the slow
path runs only for bad documents. The two must agree exactly: ``tests/provider/test_fastcheck.py`` checks that
with hypothesis on mutated documents.

Only the keywords our schemas use are supported. A schema with any other keyword is refused at compile time
(``UnsupportedSchema``), so a future schema edit cannot be silently under-checked: the caller then falls back to
jsonschema for that schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urldefrag, urljoin

Predicate = Callable[[Any], bool]

#: Keywords that assert nothing.
_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "$comment", "examples", "default"})
#: Keywords handled here, grouped by the JSON type they constrain (None = any type).
_OBJECT = ("properties", "required", "additionalProperties", "propertyNames", "minProperties")
_ARRAY = ("prefixItems", "items", "minItems", "maxItems")
_STRING = ("minLength", "maxLength", "pattern", "format")
_NUMBER = ("minimum", "maximum")
_ANY = ("$ref", "type", "enum", "const", "if", "then", "else")
_KNOWN = frozenset(_OBJECT + _ARRAY + _STRING + _NUMBER + _ANY) | _ANNOTATIONS

_TYPE_TESTS = {
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "string": "isinstance({v}, str)",
    "integer": "(isinstance({v}, int) and not isinstance({v}, bool) or isinstance({v}, float) and {v}.is_integer())",
    "number": "(isinstance({v}, (int, float)) and not isinstance({v}, bool))",
    "boolean": "isinstance({v}, bool)",
    "null": "{v} is None",
}
_NUMBER_TEST = _TYPE_TESTS["number"].format(v="x")
#: Keywords a schema may have and still be checked by an inline expression instead of a function call (the
#: generated code is dominated by call overhead otherwise: a machine entry has a dozen tiny subschemas).
_INLINE = frozenset(
    {"$ref", "type", "enum", "const", "minLength", "maxLength", "pattern", "format", "minimum", "maximum"}
)
_INLINE_DEPTH = 4


class UnsupportedSchema(ValueError):
    """The schema uses a keyword this compiler does not implement."""


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def json_equal(a: object, b: object) -> bool:
    """JSON equality: ``true`` is not ``1``, but ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if _is_number(a) and _is_number(b):
        return a == b
    return type(a) is type(b) and a == b


class Compiler:
    """Compiles the schemas of one registry. ``call_rules`` maps each schema's ``$id`` to its contents;
    ``formats`` maps a format name to its checker (other formats are annotations, as in jsonschema)."""

    def __init__(self, documents: Mapping[str, Any], formats: Mapping[str, Predicate]) -> None:
        self._documents = dict(documents)
        self._formats = dict(formats)
        self._names: dict[str, str] = {}  # uri -> generated function name
        self._namespace: dict[str, Any] = {"json_equal": json_equal, "_MISSING": object()}
        self._pending: list[tuple[str, Any, str]] = []  # (function name, schema, base uri) to generate

    def compile(self, uri: str) -> Predicate:
        """The predicate of the schema at ``uri`` (``<document $id>`` or ``<$id>#/json/pointer``)."""
        names_before = dict(self._names)
        try:
            name = self._function_for(uri)
            source: list[str] = []
            while self._pending:
                fname, schema, base = self._pending.pop()
                source += self._function(fname, schema, base)
        except UnsupportedSchema:
            # Forget this batch, so a later compile of another schema does not refer to functions never built.
            self._names, self._pending = names_before, []
            raise
        if source:
            exec(compile("\n".join(source), f"<fastcheck {uri}>", "exec"), self._namespace)  # noqa: S102
        return self._namespace[name]

    def _function_for(self, uri: str) -> str:
        url, fragment = urldefrag(uri)
        key = f"{url}#{fragment}"
        if key not in self._names:
            self._names[key] = f"_v{len(self._names)}"
            self._pending.append((self._names[key], self._resolve(url, fragment), url))
        return self._names[key]

    def _resolve(self, url: str, fragment: str) -> Any:
        node = self._documents[url]
        for part in filter(None, fragment.split("/")):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def _constant(self, value: Any) -> str:
        name = f"_c{len(self._namespace)}"
        self._namespace[name] = value
        return name

    def _subschema(self, schema: Any, base: str) -> str:
        """The name of a function checking an inline subschema (generated later, in the same batch)."""
        name = f"_s{len(self._namespace)}"
        self._namespace[name] = None  # reserve the name
        self._pending.append((name, schema, base))
        return name

    # --- code generation ----------------------------------------------------------------------------------------

    def _function(self, name: str, schema: Any, base: str) -> list[str]:
        if schema is True or schema is False:
            return [f"def {name}(x):", f"    return {schema}"]
        unknown = set(schema) - _KNOWN
        if unknown:
            raise UnsupportedSchema(f"keywords {sorted(unknown)!r} are not supported by the fast checker")
        body: list[str] = []
        body += self._any_type(schema, base)
        for guard, keys, emit in (
            ("isinstance(x, dict)", _OBJECT, self._object),
            ("isinstance(x, list)", _ARRAY, self._array),
            ("isinstance(x, str)", _STRING, self._string),
            (_NUMBER_TEST, _NUMBER, self._number),
        ):
            lines = emit(schema, base) if any(k in schema for k in keys) else []
            if lines:
                body.append(f"if {guard}:")
                body += ["    " + line for line in lines]
        body.append("return True")
        return [f"def {name}(x):"] + ["    " + line for line in body]

    def _any_type(self, schema: Any, base: str) -> list[str]:
        out = []
        if "type" in schema:
            out.append(f"if not {self._type_test(schema['type'], 'x')}: return False")
        if "$ref" in schema:
            target = urljoin(base, schema["$ref"])
            out.append(f"if not {self._function_for(target)}(x): return False")
        if "enum" in schema:
            values = schema["enum"]
            if all(isinstance(v, str) for v in values):
                out.append(f"if not (isinstance(x, str) and x in {self._constant(frozenset(values))}): return False")
            else:
                out.append(f"if not any(json_equal(x, v) for v in {self._constant(list(values))}): return False")
        if "const" in schema:
            out.append(f"if not json_equal(x, {self._constant(schema['const'])}): return False")
        if "if" in schema:
            cond = self._subschema(schema["if"], base)
            then = self._subschema(schema.get("then", True), base)
            other = self._subschema(schema.get("else", True), base)
            out.append(f"if not ({then}(x) if {cond}(x) else {other}(x)): return False")
        return out

    def _type_test(self, types: str | list[str], var: str) -> str:
        names = [types] if isinstance(types, str) else types
        return "(" + " or ".join(_TYPE_TESTS[t].format(v=var) for t in names) + ")"

    def _check(self, schema: Any, base: str, var: str) -> str:
        """A boolean expression checking ``var`` against ``schema``: inline when simple, else a function call."""
        expr = self._inline(schema, base, var, 0)
        return expr if expr is not None else f"{self._subschema(schema, base)}({var})"

    def _inline(self, schema: Any, base: str, var: str, depth: int) -> str | None:
        if schema is True or schema is False:
            return str(schema)
        if depth > _INLINE_DEPTH or set(schema) - _ANNOTATIONS - _INLINE:
            return None
        parts = []
        if "$ref" in schema:
            url, fragment = urldefrag(urljoin(base, schema["$ref"]))
            target = self._inline(self._resolve(url, fragment), url, var, depth + 1)
            parts.append(target if target is not None else f"{self._function_for(f'{url}#{fragment}')}({var})")
        types = schema.get("type")
        if types is not None:
            parts.append(self._type_test(types, var))
        if "enum" in schema:
            values = schema["enum"]
            if all(isinstance(v, str) for v in values):
                parts.append(f"(isinstance({var}, str) and {var} in {self._constant(frozenset(values))})")
            else:
                parts.append(f"any(json_equal({var}, e) for e in {self._constant(list(values))})")
        if "const" in schema:
            parts.append(f"json_equal({var}, {self._constant(schema['const'])})")
        strings = self._string(schema, base, var)
        if strings:
            parts.append(self._guarded(types == "string", f"isinstance({var}, str)", strings))
        numbers = self._number(schema, base, var)
        if numbers:
            parts.append(self._guarded(types in ("integer", "number"), _TYPE_TESTS["number"].format(v=var), numbers))
        return "(" + " and ".join(parts) + ")" if parts else "True"

    @staticmethod
    def _guarded(typed: bool, guard: str, failing: list[str]) -> str:
        """Turn ``if <bad>: return False`` lines into one expression that holds for good values (and for values
        of other types, unless the schema's own type already rules them out)."""
        ok = " and ".join(f"not ({line[3:].removesuffix(': return False')})" for line in failing)
        return f"({ok})" if typed else f"(not {guard} or ({ok}))"

    def _object(self, schema: Any, base: str) -> list[str]:
        out = []
        required = schema.get("required", [])
        if required:
            out.append(f"if not {self._constant(frozenset(required))}.issubset(x.keys()): return False")
        if "minProperties" in schema:
            out.append(f"if len(x) < {int(schema['minProperties'])}: return False")
        for prop, sub in schema.get("properties", {}).items():
            if sub is True:
                continue
            if prop in required:  # present: the line above returned otherwise
                out.append(f"v = x[{prop!r}]")
                out.append(f"if not {self._check(sub, base, 'v')}: return False")
                continue
            out.append(f"v = x.get({prop!r}, _MISSING)")
            out.append(f"if v is not _MISSING and not {self._check(sub, base, 'v')}: return False")
        extra = schema.get("additionalProperties", True)
        names = schema.get("propertyNames", True)
        if extra is not True or names is not True:
            known = self._constant(frozenset(schema.get("properties", {})))
            out.append("for k, v in x.items():")
            if names is not True:
                out.append(f"    if not {self._check(names, base, 'k')}: return False")
            if extra is False:
                out.append(f"    if k not in {known}: return False")
            elif extra is not True and not schema.get("properties"):  # every key is an additional one
                out.append(f"    if not {self._check(extra, base, 'v')}: return False")
            elif extra is not True:
                out.append(f"    if k not in {known} and not {self._check(extra, base, 'v')}: return False")
        return out

    def _array(self, schema: Any, base: str) -> list[str]:
        out = []
        if "minItems" in schema:
            out.append(f"if len(x) < {int(schema['minItems'])}: return False")
        if "maxItems" in schema:
            out.append(f"if len(x) > {int(schema['maxItems'])}: return False")
        prefix = schema.get("prefixItems", [])
        for i, sub in enumerate(prefix):
            out.append(f"if len(x) > {i} and not {self._check(sub, base, f'x[{i}]')}: return False")
        items = schema.get("items", True)
        if items is False:
            out.append(f"if len(x) > {len(prefix)}: return False")
        elif items is not True:
            rest = f"x[{len(prefix)}:]" if prefix else "x"
            out.append(f"for v in {rest}:")
            out.append(f"    if not {self._check(items, base, 'v')}: return False")
        return out

    def _string(self, schema: Any, base: str, x: str = "x") -> list[str]:
        out = []
        if "minLength" in schema:
            out.append(f"if len({x}) < {int(schema['minLength'])}: return False")
        if "maxLength" in schema:
            out.append(f"if len({x}) > {int(schema['maxLength'])}: return False")
        if "pattern" in schema:
            # JSON Schema patterns are unanchored: search, not match.
            out.append(f"if {self._constant(re.compile(schema['pattern']).search)}({x}) is None: return False")
        if schema.get("format") in self._formats:
            out.append(f"if not {self._constant(self._formats[schema['format']])}({x}): return False")
        return out

    def _number(self, schema: Any, base: str, x: str = "x") -> list[str]:
        out = []
        if "minimum" in schema:
            out.append(f"if {x} < {self._constant(schema['minimum'])}: return False")
        if "maximum" in schema:
            out.append(f"if {x} > {self._constant(schema['maximum'])}: return False")
        return out
