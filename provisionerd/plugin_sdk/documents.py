"""Answers that every plugin builds the same way, as plain dicts (standard library only, for ``python -S``).

``describe`` is the ``describeProvider`` answer, ``request_status`` one entry of ``getRequestStatus`` with its
status rolled up from its machines' results, and ``unknown_request`` the entry for a requestId the plugin cannot
account for. ``values`` has the same documents as typed attrs values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CONTRACT_VERSION = 1


def describe(
    name: str,
    version: str,
    *,
    price_quotes: bool = False,
    stop_machines: bool = False,
    idempotent_request: bool = True,
    list_machines: bool = True,
    tags: bool = True,
    **more_features: bool,
) -> dict[str, Any]:
    """The ``describeProvider`` answer; ``more_features`` are further flags (``licensePools=True``). Add the
    plugin's own extension fields to the dict it returns."""
    features = {
        "idempotentRequest": idempotent_request,
        "listMachines": list_machines,
        "stopMachines": stop_machines,
        "tags": tags,
        "priceQuotes": price_quotes,
        **more_features,
    }
    return {"name": name, "version": version, "contractVersion": CONTRACT_VERSION, "features": features}


def rollup(results: Iterable[str]) -> str:
    """A request's status from its machines' results: ``running`` while any is ``executing``, else
    ``complete_with_error`` when any is ``fail``, else ``complete``."""
    seen = set(results)
    if "executing" in seen:
        return "running"
    return "complete_with_error" if "fail" in seen else "complete"


def request_status(request_id: str, machines: list[Mapping[str, Any]], message: str | None = None) -> dict[str, Any]:
    """One ``getRequestStatus`` entry, its ``status`` rolled up from ``machines`` (each with a ``result``)."""
    doc: dict[str, Any] = {
        "requestId": request_id,
        "status": rollup(str(m["result"]) for m in machines),
        "machines": machines,
    }
    if message is not None:
        doc["message"] = message
    return doc


def unknown_request(request_id: str, why: str = "unknown request") -> dict[str, Any]:
    """The entry for a requestId the plugin has no record of: ``complete_with_error`` with no machines."""
    return {"requestId": request_id, "status": "complete_with_error", "machines": [], "message": why}


def result_counts(machines: Iterable[Mapping[str, Any]]) -> str:
    """``"2 executing, 1 succeed"``: how many machines have each result, in result order."""
    results = [str(m["result"]) for m in machines]
    return ", ".join(f"{results.count(r)} {r}" for r in sorted(set(results)))


def return_status(request_id: str, machines: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A return request's ``getRequestStatus`` entry: ``"<n> of <m> returned"``, n the machines whose return
    succeeded."""
    done = sum(m["result"] == "succeed" for m in machines)
    return request_status(request_id, machines, f"{done} of {len(machines)} returned")
