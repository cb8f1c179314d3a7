"""The plugin's own records in ``$PRO_DATA_DIR``: a cache of what it did, never the truth about what exists.

Slurm is the truth (``squeue`` by owner tags); these files only remember what Slurm cannot tell us cheaply or at all:
which jobs a request made (once they have been purged from slurmctld), and which jobs we cancelled ourselves (so a
cancellation by anyone else reads as a reclaim). Losing the directory loses no machine: a request is found again by
its op tag, and our cancellations are also marked in the job's comment.

Layout: ``requests/<sha>.json`` (one per requestId), ``returned/<job id>`` (empty markers), ``locks/<sha>.lock``.
Writes are atomic (``plugin_sdk.atomic``); ``locked`` serialises work on one op_id across threads and
processes (one-shot calls may run concurrently).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.atomic import write_private_json
from provisionerd.plugin_sdk.datadir import data_dir, private_dirs, record_name
from provisionerd.plugin_sdk.errors import PluginError

_MAX_RECORD = 4 << 20


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        private_dirs(root, ("requests", "returned", "locks"))

    @classmethod
    def from_environment(cls) -> Store:
        return cls(data_dir())

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Exclusive for ``key`` across threads and processes (flock locks belong to each open file)."""
        fd = os.open(self.root / "locks" / f"{record_name(key)}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def load(self, request_id: str) -> dict[str, Any] | None:
        path = self.root / "requests" / f"{record_name(request_id)}.json"
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_RECORD + 1)
            record = json.loads(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise PluginError("provider_error", f"the record of request {request_id!r} is unreadable: {exc}") from None
        if not isinstance(record, dict) or record.get("requestId") != request_id:
            raise PluginError("provider_error", f"the record of request {request_id!r} is corrupt")
        return record

    def save(self, record: dict[str, Any]) -> None:
        write_private_json(self.root / "requests" / f"{record_name(record['requestId'])}.json", record)

    def mark_returned(self, job_id: str) -> None:
        if job_id.isdigit():  # a job id names the file: nothing else may
            (self.root / "returned" / job_id).touch()

    def is_returned(self, job_id: str) -> bool:
        return job_id.isdigit() and (self.root / "returned" / job_id).exists()
