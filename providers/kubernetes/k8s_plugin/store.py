"""What the plugin keeps in ``$PRO_DATA_DIR``: return requests and markers of the pods it returned, and the
templates the scheduler could not place lately. Everything else lives in the cluster (labels, annotations).

Files are written atomically (``plugin_sdk.atomic``: temporary file, fsync, rename) with mode 0600 in 0700
directories; names are hashes, so no input can pick a path.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.atomic import write_private_json
from provisionerd.plugin_sdk.datadir import private_dirs, record_name

_MAX_RECORD = 4 << 20


def _key(text: str) -> str:
    return record_name(text, 32)


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        private_dirs(root, ("returns", "returned", "unschedulable"))

    @classmethod
    def from_environment(cls) -> Store:
        data = os.environ.get("PRO_DATA_DIR") or tempfile.mkdtemp(prefix="pvd-k8s-")
        return cls(Path(data))

    def _write(self, path: Path, doc: Any) -> None:
        write_private_json(path, doc)

    def _read(self, path: Path) -> Any:
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_RECORD + 1)
        except FileNotFoundError:
            return None
        if len(data) > _MAX_RECORD:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def save_return(self, request_id: str, doc: dict[str, Any]) -> None:
        self._write(self.root / "returns" / _key(request_id), doc)

    def load_return(self, request_id: str) -> dict[str, Any] | None:
        doc = self._read(self.root / "returns" / _key(request_id))
        return doc if isinstance(doc, dict) else None

    def mark_returned(self, pod_name: str) -> None:
        self._write(self.root / "returned" / _key(pod_name), {"pod": pod_name})

    def is_returned(self, pod_name: str) -> bool:
        return (self.root / "returned" / _key(pod_name)).exists()

    def mark_unschedulable(self, template_id: str, until: float, message: str) -> None:
        self._write(self.root / "unschedulable" / _key(template_id), {"until": until, "message": message})

    def unschedulable(self, template_id: str, now: float) -> str | None:
        doc = self._read(self.root / "unschedulable" / _key(template_id))
        if isinstance(doc, dict) and isinstance(doc.get("until"), (int, float)) and doc["until"] > now:
            return str(doc.get("message", ""))
        return None
