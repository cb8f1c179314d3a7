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


def read_awsv2(data_dir: str) -> StateRead:
    """The awsv2 plugin's ``aws-db.json`` in ``data_dir``."""
    path = Path(data_dir) / "aws-db.json"
    where = str(path)
    if not data_dir:
        return StateRead(where, problem="the provider has no data_dir, so its state file cannot be found")
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_BYTES:
                return StateRead(where, problem=f"larger than {MAX_BYTES} bytes: not read")
            document = json.loads(f.read(MAX_BYTES + 1))
    except FileNotFoundError:
        return StateRead(where, problem="does not exist (the plugin recorded nothing, or data_dir is not its)")
    except (OSError, ValueError) as exc:
        return StateRead(where, problem=f"unreadable: {type(exc).__name__}")
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


def _text(value: Any) -> str:
    return value[:256] if isinstance(value, str) else ""


READERS: Mapping[str, Callable[[str], StateRead]] = {"awsv2": read_awsv2}
