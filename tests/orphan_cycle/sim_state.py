"""Test-only edits of the simulated provider's state file, ``$PRO_DATA_DIR/state.json``.

The plugin has no action that creates an untagged machine (``requestMachines`` insists on the owner tags) or one
launched long ago, and a test must not change the plugin for that. These helpers edit the file in the layout
documented in ``providers/simulated/simprovider/engine.py`` (``version``, ``next``, ``ops``, ``requests``,
``machines``, ``faults``), under the plugin's own ``fcntl`` lock on ``state.lock``, and replace it atomically,
exactly as the plugin's ``Store`` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def editing(data_dir: Path) -> Iterator[dict[str, Any]]:
    """Lock, load (or start) the state, let the caller change it, save it atomically."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "state.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = data_dir / "state.json"
        if path.exists():
            state = json.loads(path.read_text())
        else:
            state = {
                "version": 1,
                "next": {"machine": 0, "request": 0},
                "ops": {},
                "requests": {},
                "machines": {},
                "faults": {},
            }
        yield state
        tmp = path.with_suffix(".test.tmp")
        tmp.write_text(json.dumps(state, separators=(",", ":")))
        os.replace(tmp, path)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read(data_dir: Path) -> dict[str, Any]:
    return json.loads((data_dir / "state.json").read_text())


def plant_machine(data_dir: Path, machine_id: str, tags: dict[str, str], launchtime: int, n: int = 200) -> None:
    """A running machine nobody asked this provider for (a console launch, another tool's leftover)."""
    with editing(data_dir) as state:
        ip = f"10.9.{n // 256}.{n % 256}"
        state["machines"][machine_id] = {
            "machineId": machine_id,
            "name": "ip-" + ip.replace(".", "-"),
            "privateIpAddress": ip,
            "seq": 10_000 + n,
            "templateId": "sim-cpu-8",
            "requestId": "",
            "launchtime": launchtime,
            "state": "running",
            "tags": dict(tags),
            "instanceRef": tags.get("provisionerd:instance", ""),
            "joinTokenSha256": hashlib.sha256(machine_id.encode()).hexdigest(),
        }


def backdate(data_dir: Path, machine_id: str, launchtime: int) -> None:
    """Set a machine's cloud launch time (as if it had been launched then) and mark it running."""
    with editing(data_dir) as state:
        machine = state["machines"][machine_id]
        machine["launchtime"] = launchtime
        machine["state"] = "running"
