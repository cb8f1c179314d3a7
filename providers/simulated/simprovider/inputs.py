"""Checks on a call's input: anything malformed is refused as ``invalid_request`` with the field's path.

Messages quote offending values, except join tokens: a malformed bootstrap is described, never echoed.
"""

from __future__ import annotations

import re

from provisionerd.plugin_sdk.errors import PluginError

#: Bounds that keep one call's work small whatever the caller sends.
MAX_ITEMS = 10_000
#: The op_id becomes the cloud's client token, so it keeps to the strictest client-token rules (AWS: 64 ASCII).
OP_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
OWNER_KEYS = ("provisionerd:cluster", "provisionerd:provider", "provisionerd:op", "provisionerd:epoch")


def bad(where: str, what: str) -> PluginError:
    return PluginError("invalid_request", f"{where}: {what}")


def obj(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise bad(where, f"expected an object, got {type(value).__name__}")
    return value


def non_empty_str(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad(where, f"expected a non-empty string, got {value!r}")
    return value


def items(value: object, where: str, required: bool) -> list:
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise bad(where, f"expected a list, got {type(value).__name__}")
    if required and not value:
        raise bad(where, "expected at least one item")
    if len(value) > MAX_ITEMS:
        raise bad(where, f"at most {MAX_ITEMS} items")
    return value


def string_map(value: object, where: str) -> dict:
    tags = obj(value, where)
    for key, val in tags.items():
        if not isinstance(val, str):
            raise bad(f"{where}.{key}", f"expected a string, got {val!r}")
    return tags


def op_and_tags(inp: dict) -> tuple[str, dict]:
    """The idempotency key and the owner tags every mutating call carries."""
    op_id = inp.get("op_id")
    if not isinstance(op_id, str) or not OP_ID.match(op_id):
        raise bad("op_id", f"expected 1-64 characters of [A-Za-z0-9._:-], got {op_id!r}")
    tags = string_map(inp.get("tags"), "tags")
    for key in OWNER_KEYS:
        non_empty_str(tags.get(key), f"tags.{key}")
    return op_id, tags


def bootstrap_list(value: object, count: int) -> list:
    """One bootstrap per machine, in order."""
    boots = items(value, "bootstrap", required=True)
    if len(boots) != count:
        raise bad("bootstrap", f"expected one entry per machine ({count}), got {len(boots)}")
    for i, boot in enumerate(boots):
        obj(boot, f"bootstrap[{i}]")
        non_empty_str(boot.get("instanceRef"), f"bootstrap[{i}].instanceRef")
        if not isinstance(boot.get("joinToken"), str) or not boot["joinToken"]:
            raise bad(f"bootstrap[{i}].joinToken", "expected a non-empty string")  # the value is a secret
        controllers = boot.get("controllers")
        if not isinstance(controllers, list) or not all(isinstance(c, str) for c in controllers):
            raise bad(f"bootstrap[{i}].controllers", 'expected a list of "host:port" strings')
    return boots


def request_refs(inp: dict) -> list[str]:
    refs = items(inp.get("requests"), "requests", required=True)
    return [
        non_empty_str(obj(r, f"requests[{i}]").get("requestId"), f"requests[{i}].requestId") for i, r in enumerate(refs)
    ]


def machine_refs(inp: dict, required: bool) -> list[dict]:
    refs = items(inp.get("machines"), "machines", required=required)
    out = []
    for i, ref in enumerate(refs):
        obj(ref, f"machines[{i}]")
        mid = non_empty_str(ref.get("machineId"), f"machines[{i}].machineId")
        name = ref.get("name", "")
        if not isinstance(name, str):
            raise bad(f"machines[{i}].name", f"expected a string, got {name!r}")
        out.append({"machineId": mid, "name": name})
    return out


def tag_filter(value: object) -> dict:
    """``listMachines`` filter: it must name the cluster, so a listing never spans clusters by accident."""
    tags = string_map(value, "tags")
    non_empty_str(tags.get("provisionerd:cluster"), "tags.provisionerd:cluster")
    return tags


def paging(inp: dict) -> tuple[str | None, int | None]:
    """The paging fields of ``listMachines`` and ``getReturnRequests`` (both optional): ``cursor``, ``pageSize``."""
    cursor = inp.get("cursor")
    if cursor is not None:
        non_empty_str(cursor, "cursor")
    size = inp.get("pageSize")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise bad("pageSize", f"expected an integer >= 1, got {size!r}")
    return cursor, size
