"""Read a demand document (what ``refcontroller admin demand --file`` takes): a JSON array of demand items.

Each item is ``{"demand_id": str, "shape": {"ncpus": int, "mem_mb": int, "gpus": int, "gpu_type": str|null,
"arch": str|null, "attributes": {str: str}}, "count": int, "max_hourly_cost": number|null, "providers": [str],
"placement": {str: str}, "reservation": str, "release": "" | "on_completion",
"cost_currency": str}``; only ``demand_id``, ``shape`` and ``count`` are required. The document is checked
against this JSON Schema first (cattrs alone would turn ``"5"`` or ``5.7`` into ``5``), then structured.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import DemandItem
from refcontroller.jsonconv import JsonDocumentError, demand_items_from_json

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
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def parse_demand(text: str, source: str = "demand") -> tuple[DemandItem, ...]:
    """Demand items from JSON text; ``ConfigError`` listing every problem with its path otherwise."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON", [f"$: {exc}"]) from exc
    errors = sorted(_VALIDATOR.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        problems = [f"{e.json_path}: {e.message}" for e in errors]
        raise ConfigError(f"{source} is not a valid demand document", problems)
    try:
        return demand_items_from_json(text)
    except JsonDocumentError as exc:
        raise ConfigError(f"{source} is not a valid demand document", [str(exc)]) from exc
