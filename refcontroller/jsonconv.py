"""The one JSON converter of the reference controller: facts, demand items and host states to and from JSON text.

Facts are stored in the fact log as JSON objects tagged with ``"kind": "<class name>"`` (for example
``{"kind": "RequestIntent", "provider": "p", "epoch": {"term": 2, "seq": 1}, ...}``). Unknown keys are refused, so a
document written by a newer version is not half-read. The same converter renders the admin status document.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import cattrs
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from provisionerd.domain.errors import ProvisionerdError
from provisionerd.domain.model import FACT_TYPES, DemandItem, Fact, LicenseUse

converter = make_converter(forbid_extra_keys=True)
configure_tagged_union(Fact, converter, tag_name="kind")


class JsonDocumentError(ProvisionerdError):
    """A stored or supplied JSON document does not match its type; the message carries the cattrs paths."""


def _structure(data: Any, cls: Any, what: str) -> Any:
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            detail = "; ".join(cattrs.transform_error(exc, path="$"))
        else:
            detail = str(exc)
        raise JsonDocumentError(f"invalid {what}: {detail}") from exc


def fact_to_json(fact: Fact) -> str:
    """Canonical JSON text of ``fact`` (sorted keys, no spaces): equal facts give equal text."""
    return json.dumps(converter.unstructure(fact, Fact), sort_keys=True, separators=(",", ":"))


def fact_from_json(text: str) -> Fact:
    """The fact stored as ``text`` (``fact_to_json``). Raises ``JsonDocumentError`` (with the cattrs paths)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonDocumentError(f"invalid fact: {exc}") from exc
    kind = data.get("kind") if type(data) is dict else None
    fast = _FAST_FACTS.get(kind) if type(kind) is str else None
    if fast is not None and (fact := fast(data)) is not _MISSING:
        return fact
    return _structure(data, Fact, "fact")


def demand_items_to_json(items: Sequence[DemandItem]) -> str:
    return json.dumps(converter.unstructure(tuple(items), tuple[DemandItem, ...]), sort_keys=True)


def demand_items_from_json(text: str) -> tuple[DemandItem, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonDocumentError(f"invalid demand items: {exc}") from exc
    return _structure(data, tuple[DemandItem, ...], "demand items")


def licenses_to_json(uses: Sequence[LicenseUse]) -> str:
    return json.dumps([[u.provider, u.pool, u.in_use] for u in uses])


def licenses_from_json(text: str | None) -> tuple[LicenseUse, ...]:
    """The stored licence use of the demand snapshot (none stored, by an older controller: none)."""
    if not text:
        return ()
    try:
        return tuple(LicenseUse(str(p), str(pool), int(n)) for p, pool, n in json.loads(text))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise JsonDocumentError(f"invalid demand licences: {exc}") from exc


def unstructure(value: Any, cls: Any = None) -> Any:
    """Plain JSON-ready data for ``value`` (used for the admin status document)."""
    return converter.unstructure(value, cls) if cls is not None else converter.unstructure(value)


# --- the fast path of fact_from_json ------------------------------------------------------------------------------
# A resync page is read from the store as a few hundred JSON texts, and cattrs' tagged union costs ~8 us a fact on
# top of json.loads (~1 s of the controller's loop in a resync of 110,000 facts). A document of exactly the shape
# ``fact_to_json`` writes (each value of its field's own JSON type, no key but the fields and ``kind``) is built by
# a function compiled per class from its attrs fields (~3 us); anything else (a missing or unknown key, an int
# where a float or a text is expected, which cattrs would coerce) goes to cattrs, so the result, or the error, is
# the converter's in every case (tests/refcontroller/test_jsonconv.py holds the two to the same answers).

_MISSING: Any = object()
#: JSON types taken as they are (``type(value) is t``; a bool is not an int here, an int is not a float, and only
#: a bool is a bool).
_SCALARS = (str, int, float, bool)


def _compiled(name: str, source: str, env: dict[str, Any]) -> Callable[[Any], Any]:
    exec(compile(source, f"<jsonconv {name}>", "exec"), env)  # noqa: S102 - made from the classes' own field names
    fn: Callable[[Any], Any] = env["read"]
    return fn


def _reader(cls: type, extra: frozenset[str] = frozenset()) -> Callable[[Any], Any] | None:
    """``read(document) -> cls`` or ``_MISSING`` (cattrs decides) for an attrs class of the covered field types
    (texts, ints, floats, tuples of texts, nested such classes); ``None`` when ``cls`` is not covered (a field of
    another type, a factory default, a validator or a converter). ``extra``: keys the document may hold besides
    the fields (the union's tag)."""
    attrs.resolve_types(cls)
    fields = attrs.fields(cls)
    env: dict[str, Any] = {"cls": cls, "MISSING": _MISSING, "tuple": tuple, "type": type, "len": len}
    env["names"] = frozenset(f.name for f in fields) | extra
    lines = ["def read(d):", "    if type(d) is not dict or not names.issuperset(d):", "        return MISSING"]
    for i, field in enumerate(fields):
        if field.validator or field.converter or not field.init or isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            return None
        lines += [f"    v{i} = d.get({field.name!r}, MISSING)", f"    if v{i} is MISSING:"]
        if field.default is attrs.NOTHING:
            lines.append("        return MISSING")
        else:
            env[f"default{i}"] = field.default
            lines += [f"        v{i} = default{i}", "    else:"]
        pad = "    " if field.default is attrs.NOTHING else "        "
        if field.type in _SCALARS:
            env[f"t{i}"] = field.type
            lines += [f"{pad}if type(v{i}) is not t{i}:", f"{pad}    return MISSING"]
        elif field.type == tuple[str, ...]:
            lines += [f"{pad}if type(v{i}) is not list:", f"{pad}    return MISSING"]
            lines += [f"{pad}for x in v{i}:", f"{pad}    if type(x) is not str:", f"{pad}        return MISSING"]
            lines += [f"{pad}v{i} = tuple(v{i})"]
        elif isinstance(field.type, type) and attrs.has(field.type) and (nested := _reader(field.type)) is not None:
            env[f"r{i}"] = nested
            lines += [f"{pad}v{i} = r{i}(v{i})", f"{pad}if v{i} is MISSING:", f"{pad}    return MISSING"]
        else:
            return None
    lines.append(f"    return cls({', '.join(f'v{i}' for i in range(len(fields)))})")
    return _compiled(cls.__name__, "\n".join(lines) + "\n", env)


_FAST_FACTS: dict[str, Callable[[Any], Any]] = {
    cls.__name__: read for cls in FACT_TYPES if (read := _reader(cls, frozenset({"kind"}))) is not None
}
