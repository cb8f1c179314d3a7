"""The one JSON converter of the reference controller: facts, demand items and host states to and from JSON text.

Facts are stored in the fact log as JSON objects tagged with ``"kind": "<class name>"`` (for example
``{"kind": "RequestIntent", "provider": "p", "epoch": {"term": 2, "seq": 1}, ...}``). Unknown keys are refused, so a
document written by a newer version is not half-read. The same converter renders the admin status document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import cattrs
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from provisionerd.domain.errors import ProvisionerdError
from provisionerd.domain.model import DemandItem, Fact, LicenseUse

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
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonDocumentError(f"invalid fact: {exc}") from exc
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
