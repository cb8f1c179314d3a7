"""Documents between our contract and the LSF one, both ways. Pure (no I/O).

Towards the plugin: ``lsf_request`` builds the exact LSF ``requestMachines`` input (no ``op_id``, tags or
bootstrap; userData from the operator's template only). From the plugin: ``normalise`` fills what LSF plugins
commonly omit from ``getRequestStatus``, ``with_machine_ids`` adds the machine ids the daemon wants to an LSF
``getReturnRequests`` answer (which names machines only), and ``salvage_request_id`` reads a requestId out of what a
plugin printed before it was killed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from provisionerd.provider.legacy.rules import UserDataTemplate
from provisionerd.provider.runtime import parse_json


def lsf_request(
    doc: Mapping[str, Any], refs: Sequence[str], template: UserDataTemplate, rc_account: str
) -> tuple[dict[str, Any], list[str]]:
    """The LSF ``requestMachines`` input for the machines ``refs`` of our input ``doc`` (one ref per call when the
    userData is per machine, then the fields are that machine's), and the secrets it carries (the join token when
    the template uses it; nothing otherwise)."""
    boot = {b["instanceRef"]: b for b in doc["bootstrap"]}
    first = boot[refs[0]]
    fields = {
        "instance_ref": refs[0],
        "join_token": first["joinToken"],
        "controllers": ",".join(first["controllers"]),
        "cluster": doc["tags"]["provisionerd:cluster"],
        "provider": doc["tags"]["provisionerd:provider"],
        "op_id": doc["op_id"],
        "epoch": doc["tags"]["provisionerd:epoch"],
    }
    lsf = {
        "template": {"templateId": doc["template"]["templateId"], "machineCount": len(refs)},
        "rc_account": doc.get("rc_account") or rc_account,
        "userData": template.render(fields) if template.values else {},
    }
    return lsf, [first["joinToken"]] if template.carries_token else []


def normalise(document: Any) -> Any:
    """Fill what LSF plugins commonly leave out of ``getRequestStatus`` (``machines`` while running, ``message``)
    so the schema judges what matters. Anything that is not the expected shape is left for the schema to refuse."""
    if isinstance(document, dict) and isinstance(document.get("requests"), list):
        for entry in document["requests"]:
            if isinstance(entry, dict):
                if entry.get("machines") is None:
                    entry["machines"] = []
                entry.setdefault("message", "")
    return document


def with_machine_ids(document: Any, asked: Iterable[Mapping[str, str]]) -> Any:
    """An LSF ``getReturnRequests`` answer names machines (``machine``); add ``machineId`` where the name is one
    of the machines ``asked`` about, unambiguously."""
    by_name: dict[str, list[str]] = {}
    for m in asked:
        by_name.setdefault(m["name"], []).append(m["machineId"])
    if isinstance(document, dict) and isinstance(document.get("requests"), list):
        for r in document["requests"]:
            ids = by_name.get(r.get("machine", "")) if isinstance(r, dict) else None
            if ids and len(ids) == 1:
                r.setdefault("machineId", ids[0])
    return document


def salvage_request_id(partial: bytes | bytearray) -> str | None:
    """A requestId from what a plugin printed before it was killed, if it printed a whole answer."""
    try:
        document = parse_json(bytes(partial).strip())
    except ValueError:
        return None
    rid = document.get("requestId") if isinstance(document, dict) else None
    return rid if isinstance(rid, str) and rid else None
