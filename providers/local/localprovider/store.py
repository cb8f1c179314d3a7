"""The local provider's records under ``$PRO_DATA_DIR``: one JSON file per machine and per request, and a lock.

    local.lock                      flock held by every call (one-shot calls may run at the same time)
    requests/<requestId>.json       a create or return request: its op_id and what it asked for
    machines/<machineId>.json       one agent: pid and start time, tags, state; never its join token
    logs/<machineId>.log            the agent's stdout and stderr

Files are replaced atomically (``plugin_sdk.atomic``: a 0600 temporary file, fsync, rename). Record names are
derived from op_ids and instance refs through SHA-256, so a caller-supplied string never becomes a path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.atomic import write_private_json
from provisionerd.plugin_sdk.errors import PluginError

#: States of a machine record. ``running`` with no live process means the agent died on its own.
STARTING, RUNNING, RETURNING, RETURNED = "starting", "running", "returning", "returned"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def create_request_id(op_id: str) -> str:
    return f"req-{_digest('create', op_id)}"


def return_request_id(op_id: str) -> str:
    return f"ret-{_digest('return', op_id)}"


def machine_id_for(op_id: str, instance_ref: str) -> str:
    return f"local-{_digest(op_id, instance_ref)}"


def _safe_name(name: str) -> bool:
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "-_." for c in name) and not name.startswith(".")


class Store:
    def __init__(self, data_dir: str) -> None:
        if not data_dir:
            raise PluginError("provider_error", "PRO_DATA_DIR is not set: the local provider needs a state directory")
        self.root = Path(data_dir).resolve()
        try:
            for sub in ("requests", "machines", "logs"):
                (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise PluginError(
                "provider_error", f"cannot create the state directory {str(self.root)!r}: {exc}"
            ) from None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / "local.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def log_path(self, machine_id: str) -> Path:
        return self.root / "logs" / f"{machine_id}.log"

    # --- records ---------------------------------------------------------------------------------------------

    def _path(self, kind: str, name: str) -> Path | None:
        return self.root / kind / f"{name}.json" if _safe_name(name) else None

    def _read(self, kind: str, name: str) -> dict[str, Any] | None:
        path = self._path(kind, name)
        if path is None:
            return None
        try:
            with open(path) as handle:
                record = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise PluginError("provider_error", f"unreadable record {path.name}: {exc}") from None
        return record if isinstance(record, dict) else None

    def _write(self, kind: str, record: dict[str, Any], name: str) -> None:
        path = self._path(kind, name)
        assert path is not None, name
        write_private_json(path, record, sort_keys=True)

    def request(self, request_id: str) -> dict[str, Any] | None:
        return self._read("requests", request_id)

    def put_request(self, record: dict[str, Any]) -> None:
        self._write("requests", record, record["requestId"])

    def machine(self, machine_id: str) -> dict[str, Any] | None:
        return self._read("machines", machine_id)

    def put_machine(self, record: dict[str, Any]) -> None:
        self._write("machines", record, record["machineId"])

    def machines(self) -> list[dict[str, Any]]:
        records = []
        for path in sorted((self.root / "machines").glob("*.json")):
            record = self._read("machines", path.stem)
            if record is not None:
                records.append(record)
        return records
