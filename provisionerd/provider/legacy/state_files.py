"""Readers of a known legacy plugin's own state file: what it recorded making, for the orphan report (issue 19 item 3).

A legacy plugin cannot list machines, so a call whose outcome stays unknown may have made machines no one can see.
Many LSF plugins keep their own record of requests and machines in ``PRO_DATA_DIR``; where the layout is known,
the report names the records the daemon's journal does not account for, instead of an empty list.

Known layouts (``[providers.legacy] state_file``):

``awsv2``
    IBM's Python AWS plugin (IBMSpectrumComputing/cloud-provider-plugins, ``hostProviders/awsv2``): one JSON file
    ``$PRO_DATA_DIR/aws-db.json``, ``{"requests": [{"requestId", "templateId", "time" (epoch ms), "rc_account",
    "machines": [{"machineId", "name", "status", "result", "privateIpAddress", "retId", ...}]}]}``, replaced
    atomically by the plugin (written to a temporary file, then renamed).

``lsfexample``
    The shipped example (``providers/examples/lsf_legacy``): ``$PRO_DATA_DIR/lsfexample-state.json``,
    ``{"machines": {"<id>": {"name", "ip", "template", "status", "launchtime"}}, "requests": {"<requestId>":
    {"kind": "create" | "return", "machines": ["<id>", ...]}}}``; a machine a return request names is returning.

Read-only, bounded (``MAX_BYTES`` read, ``MAX_REQUESTS`` requests, ``MAX_MACHINES`` machines a request): a state
file is the plugin's, never trusted to be small or well formed. Unknown fields are ignored; a malformed entry is
skipped and counted. Pure apart from reading the one file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

MAX_BYTES = 16 << 20
MAX_REQUESTS = 10_000
MAX_MACHINES = 1_000


@attrs.frozen
class PluginMachine:
    machine_id: str
    name: str
    status: str
    address: str
    returning: bool  # the plugin recorded a return for it (awsv2: ``retId``)

    def as_json(self) -> dict[str, Any]:
        return {
            "machineId": self.machine_id,
            "name": self.name,
            "status": self.status,
            "privateIpAddress": self.address,
            "returning": self.returning,
        }


@attrs.frozen
class PluginRequest:
    request_id: str
    template_id: str
    created_ms: int
    machines: tuple[PluginMachine, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "requestId": self.request_id,
            "templateId": self.template_id,
            "time": self.created_ms,
            "machines": [m.as_json() for m in self.machines],
        }


@attrs.frozen
class StateRead:
    """What a reader found: the requests, or ``problem`` (why the file could not be read), and ``where``."""

    where: str
    requests: tuple[PluginRequest, ...] = ()
    problem: str = ""
    skipped: int = 0  # malformed entries left out


def _load(data_dir: str, name: str) -> tuple[str, Any, StateRead | None]:
    """The JSON document of ``name`` in ``data_dir`` (bounded), or the ``StateRead`` that says why not."""
    where = str(Path(data_dir) / name)
    if not data_dir:
        return where, None, StateRead(where, problem="the provider has no data_dir, so its state file cannot be found")
    try:
        with open(where, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_BYTES:
                return where, None, StateRead(where, problem=f"larger than {MAX_BYTES} bytes: not read")
            return where, json.loads(f.read(MAX_BYTES + 1)), None
    except FileNotFoundError:
        problem = "does not exist (the plugin recorded nothing, or data_dir is not its)"
        return where, None, StateRead(where, problem=problem)
    except (OSError, ValueError) as exc:
        return where, None, StateRead(where, problem=f"unreadable: {type(exc).__name__}")


def read_awsv2(data_dir: str) -> StateRead:
    """The awsv2 plugin's ``aws-db.json`` in ``data_dir``."""
    where, document, failed = _load(data_dir, "aws-db.json")
    if failed is not None:
        return failed
    raw = document.get("requests") if isinstance(document, Mapping) else None
    if not isinstance(raw, list):
        return StateRead(where, problem='not the awsv2 layout (no "requests" list)')
    requests: list[PluginRequest] = []
    skipped = max(0, len(raw) - MAX_REQUESTS)
    for entry in raw[:MAX_REQUESTS]:
        request = _awsv2_request(entry)
        if request is None:
            skipped += 1
        else:
            requests.append(request)
    return StateRead(where, tuple(requests), skipped=skipped)


def _awsv2_request(entry: Any) -> PluginRequest | None:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("requestId"), str):
        return None
    machines = []
    for m in entry.get("machines", [])[:MAX_MACHINES] if isinstance(entry.get("machines"), list) else []:
        if isinstance(m, Mapping) and isinstance(m.get("machineId"), str):
            machines.append(
                PluginMachine(
                    m["machineId"][:256],
                    _text(m.get("name")),
                    _text(m.get("status")),
                    _text(m.get("privateIpAddress")),
                    bool(m.get("retId")),
                )
            )
    created = entry.get("time")
    return PluginRequest(
        entry["requestId"][:256],
        _text(entry.get("templateId")),
        created if isinstance(created, int) and not isinstance(created, bool) else 0,
        tuple(machines),
    )


def read_lsfexample(data_dir: str) -> StateRead:
    """The shipped LSF example's ``lsfexample-state.json`` in ``data_dir``: its create requests."""
    where, document, failed = _load(data_dir, "lsfexample-state.json")
    if failed is not None:
        return failed
    machines = document.get("machines") if isinstance(document, Mapping) else None
    raw = document.get("requests") if isinstance(document, Mapping) else None
    if not isinstance(machines, Mapping) or not isinstance(raw, Mapping):
        return StateRead(where, problem='not the lsfexample layout (no "machines" and "requests" objects)')
    returning = {
        mid
        for entry in list(raw.values())[:MAX_REQUESTS]
        if isinstance(entry, Mapping) and entry.get("kind") == "return" and isinstance(entry.get("machines"), list)
        for mid in entry["machines"][:MAX_MACHINES]
        if isinstance(mid, str)
    }
    requests: list[PluginRequest] = []
    skipped = max(0, len(raw) - MAX_REQUESTS)
    for request_id, entry in list(raw.items())[:MAX_REQUESTS]:
        if not isinstance(entry, Mapping) or entry.get("kind") != "create":
            continue
        ids = entry.get("machines")
        if not isinstance(request_id, str) or not isinstance(ids, list):
            skipped += 1
            continue
        found = [
            (mid, machines[mid])
            for mid in ids[:MAX_MACHINES]
            if isinstance(mid, str) and isinstance(machines.get(mid), Mapping)
        ]
        launched = [m.get("launchtime") for _, m in found if isinstance(m.get("launchtime"), int)]
        requests.append(
            PluginRequest(
                request_id[:256],
                _text(found[0][1].get("template")) if found else "",
                min(launched) * 1000 if launched else 0,
                tuple(
                    PluginMachine(
                        mid[:256], _text(m.get("name")), _text(m.get("status")), _text(m.get("ip")), mid in returning
                    )
                    for mid, m in found
                ),
            )
        )
    return StateRead(where, tuple(requests), skipped=skipped)


def _text(value: Any) -> str:
    return value[:256] if isinstance(value, str) else ""


READERS: Mapping[str, Callable[[str], StateRead]] = {"awsv2": read_awsv2, "lsfexample": read_lsfexample}
