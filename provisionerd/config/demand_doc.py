"""A demand document: the JSON array of demand items that ``refcontroller admin demand --file`` sends and
``provisionerd plan --what-if FILE`` plans for (docs/operations.md). One schema and one reader for both.

A JSON array of items ``{"demand_id": str, "shape": {"ncpus": int, "mem_mb": int, "gpus": int, "gpu_type":
str|null, "arch": str|null, "attributes": {str: str}}, "count": int, "max_hourly_cost": number|null, "providers":
[str], "placement": {str: str}, "reservation": str, "release": "" | "on_completion", "cost_currency": str,
"all_or_nothing": bool}``; only ``demand_id``, ``shape`` and ``count`` are required. Checked against the JSON
Schema first (so ``"5"`` or ``5.7`` is refused, never coerced), then built into
:class:`~provisionerd.domain.model.DemandItem` values.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import DemandItem, ResourceShape

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_NULLABLE_STR = {"type": ["string", "null"]}
_COUNT = {"type": "integer", "minimum": 0}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "array",
    "items": {
        "type": "object",
        "required": ["demand_id", "shape", "count"],
        "additionalProperties": False,
        "properties": {
            "demand_id": {"type": "string", "minLength": 1, "maxLength": 256},
            "shape": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "ncpus": _COUNT,
                    "mem_mb": _COUNT,
                    "gpus": _COUNT,
                    "gpu_type": _NULLABLE_STR,
                    "arch": _NULLABLE_STR,
                    "attributes": _STR_MAP,
                },
            },
            "count": _COUNT,
            "max_hourly_cost": {"type": ["number", "null"], "minimum": 0},
            "providers": {"type": "array", "items": {"type": "string"}},
            "placement": _STR_MAP,
            "reservation": {"type": "string", "maxLength": 256},
            "release": {"enum": ["", "on_completion"]},
            "cost_currency": {"type": "string", "pattern": "^([A-Z]{3})?$"},
            "all_or_nothing": {"type": "boolean"},
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
#: Problems listed at most in one refusal.
MAX_PROBLEMS = 20


def _item(raw: dict[str, Any]) -> DemandItem:
    shape = raw["shape"]
    cap = raw.get("max_hourly_cost")
    return DemandItem(
        demand_id=raw["demand_id"],
        shape=ResourceShape(
            ncpus=shape.get("ncpus", 1),
            mem_mb=shape.get("mem_mb", 0),
            gpus=shape.get("gpus", 0),
            gpu_type=shape.get("gpu_type"),
            arch=shape.get("arch"),
            attributes=dict(shape.get("attributes", {})),
        ),
        count=raw["count"],
        max_hourly_cost=None if cap is None else float(cap),
        providers=tuple(raw.get("providers", ())),
        placement=dict(raw.get("placement", {})),
        reservation=raw.get("reservation", ""),
        release=raw.get("release", ""),
        cost_currency=raw.get("cost_currency", ""),
        all_or_nothing=raw.get("all_or_nothing", False),
    )


def parse_demand(text: str, source: str = "demand") -> tuple[DemandItem, ...]:
    """Demand items from JSON text; ``ConfigError`` listing every problem with its JSON path otherwise."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON", [f"$: {exc}"]) from exc
    errors = sorted(_VALIDATOR.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        problems = [f"{e.json_path}: {e.message}" for e in errors[:MAX_PROBLEMS]]
        raise ConfigError(f"{source} is not a valid demand document", problems)
    return tuple(_item(raw) for raw in document)
