"""Hints this host keeps in ``$PRO_DATA_DIR``: what a request asked for, beyond what EC2's tags can say.

The truth is in EC2 (the op tags); these records only add what tags cannot hold: launch slots that failed (no
instance exists to tag), ids launched a moment ago that DescribeInstances does not show yet, and the ids of a return
whose instances were already terminated. A lost record (another host took the lease) degrades status detail, never
correctness. One JSON file per op_id, written atomically (``plugin_sdk.atomic``, mode 0600); records older than a
week are pruned.

:meth:`Records.exclusive` serialises mutations of one op_id: between threads of a persistent plugin and, through
``flock`` on a lock file next to the record, between one-shot processes on this host.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.atomic import write_private_json
from provisionerd.plugin_sdk.datadir import record_name

log = logging.getLogger(__name__)

_SUBDIR = "aws_ec2-requests"
_MAX_RECORD_BYTES = 4 << 20
_KEEP_SECONDS = 7 * 86400


class Records:
    """Read and write request records under ``data_dir`` (``None``: records are off)."""

    def __init__(self, data_dir: str | None) -> None:
        self._dir = Path(data_dir) / _SUBDIR if data_dir else None

    def _path(self, request_id: str) -> Path | None:
        if self._dir is None:
            return None
        return self._dir / (record_name(request_id) + ".json")

    @contextlib.contextmanager
    def exclusive(self, request_id: str) -> Iterator[None]:
        with _thread_lock(request_id):
            path = self._path(request_id)
            if path is None:
                yield
                return
            assert self._dir is not None
            try:
                self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                # An unusable data dir costs the cross-process lock (and the hints), not the call: the tag lookup
                # still keeps creation idempotent.
                log.warning("no lock file in %s (%s): serialising within this process only", self._dir, exc.strerror)
                yield
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def load(self, request_id: str) -> dict[str, Any] | None:
        path = self._path(request_id)
        if path is None:
            return None
        try:
            with path.open("rb") as f:
                data = f.read(_MAX_RECORD_BYTES + 1)
            record = json.loads(data)
        except (OSError, ValueError):
            return None  # a missing or damaged hint is no hint
        if not isinstance(record, dict) or record.get("requestId") != request_id:
            return None
        return record

    def save(self, request_id: str, record: dict[str, Any]) -> None:
        path = self._path(request_id)
        if path is None:
            return
        assert self._dir is not None
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private_json(path, {**record, "requestId": request_id})
        self._prune()

    def _prune(self) -> None:
        assert self._dir is not None
        cutoff = time.time() - _KEEP_SECONDS
        for entry in self._dir.iterdir():
            try:
                if entry.stat().st_mtime < cutoff:
                    entry.unlink()
            except OSError:
                pass


#: Striped locks: bounded memory however many op_ids a persistent process sees; a collision only serialises.
_LOCKS = tuple(threading.Lock() for _ in range(64))


@contextlib.contextmanager
def _thread_lock(request_id: str) -> Iterator[None]:
    with _LOCKS[hashlib.sha256(request_id.encode()).digest()[0] % len(_LOCKS)]:
        yield
