"""A provider plugin written against the plugin SDK alone (``provisionerd.plugin_sdk``): a third party's start.

Machines are records in ``$PRO_DATA_DIR`` (nothing real starts), so every rule of the contract shows without a
cloud: op_id idempotency, owner tags on every machine, tag-filtered and paged listings, harmless double returns,
typed errors, join tokens never kept. Run it as the daemon does::

    run.py persistent                        # JSON lines on stdin/stdout (the ``provider`` wrapper)
    run.py oneshot ACTION -f IN.json         # one call per process

It imports nothing of provisionerd but ``provisionerd.plugin_sdk``, and runs under ``$PROVISIONERD_PYTHON`` (the
daemon's interpreter, where provisionerd is installed). Templates come from ``$PRO_CONF_DIR/python-example.json``
(``{"templates": [{"templateId", "maxNumber", "attributes"}]}``) when it exists, else ``DEFAULT_TEMPLATES``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.atomic import write_private_json
from provisionerd.plugin_sdk.calls import dispatch
from provisionerd.plugin_sdk.config import ConfigInvalid, config_path, read_json
from provisionerd.plugin_sdk.datadir import data_dir, private_dirs, record_name
from provisionerd.plugin_sdk.documents import describe, return_status, unknown_request
from provisionerd.plugin_sdk.entry import main
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.ids import make_request_id, parse_request_id
from provisionerd.plugin_sdk.inputs import asked_template
from provisionerd.plugin_sdk.values import INSTANCE_TAG, Machine, RequestStatus, Template, matches, owner_tags

NAME, VERSION, PREFIX = "python-example", "1.0.0", "pyex"
CONFIG_FILE = "python-example.json"
DEFAULT_TEMPLATES = (
    Template("pyex-small", 20, {"type": ("String", "X86_64"), "ncpus": ("Numeric", "2"), "mem": ("Numeric", "4096")}),
    Template("pyex-large", 5, {"type": ("String", "X86_64"), "ncpus": ("Numeric", "16"), "mem": ("Numeric", "65536")}),
)


def load_templates() -> dict[str, Template]:
    """The configured templates (typed ``ConfigError``s: ``provider_error``), else the defaults."""
    path = config_path(CONFIG_FILE) if os.environ.get("PRO_CONF_DIR") else None
    if path is None or not path.exists():
        return {t.template_id: t for t in DEFAULT_TEMPLATES}
    doc = read_json(path)
    try:
        templates = [Template(t["templateId"], int(t["maxNumber"]), t["attributes"]) for t in doc["templates"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigInvalid(f"{CONFIG_FILE}: templates: {type(exc).__name__}: {exc}", path) from None
    return {t.template_id: t for t in templates}


class Records:
    """``machines/``, ``requests/`` and ``ops/`` under the data directory, one JSON file each (0600, atomic).
    ``exclusive`` serialises calls between threads and between one-shot processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        private_dirs(root, ("machines", "requests", "ops"))
        self._threads = threading.Lock()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._threads, open(os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def get(self, kind: str, key: str) -> Any:
        path = self.root / kind / f"{record_name(key)}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, kind: str, key: str, doc: Any) -> None:
        write_private_json(self.root / kind / f"{record_name(key)}.json", doc)

    def drop(self, kind: str, key: str) -> None:
        (self.root / kind / f"{record_name(key)}.json").unlink(missing_ok=True)

    def machines(self) -> list[Machine]:
        docs = (json.loads(p.read_text()) for p in (self.root / "machines").glob("*.json"))
        return sorted((_machine(d) for d in docs), key=lambda m: m.machine_id)


def _machine(doc: Mapping[str, Any]) -> Machine:
    return Machine(doc["machineId"], doc["name"], "succeed", "running", doc["launchtime"], tags=doc["tags"])


class ExamplePlugin:
    def __init__(self) -> None:
        self.templates = load_templates()
        self.records = Records(data_dir())
        self.actions = {
            "describeProvider": lambda doc: describe(NAME, VERSION),
            "getAvailableTemplates": lambda doc: {"templates": [t.to_contract() for t in self.templates.values()]},
            "requestMachines": self.request_machines,
            "getRequestStatus": lambda doc: {"requests": [self.status(r["requestId"]) for r in doc["requests"]]},
            "requestReturnMachines": self.request_return,
            "getReturnRequests": lambda doc: {"requests": []},  # this "cloud" never takes a machine back
            "listMachines": self.list_machines,
        }

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        return dispatch(self.actions, action, doc)

    def _replay(self, doc: Mapping[str, Any], kind: str, ask: Any) -> tuple[str, str | None]:
        """``(requestId, None)`` for a new op, ``(requestId, requestId)`` for one seen with the same ask."""
        tags = owner_tags(doc)
        request_id = make_request_id(PREFIX, kind, record_name(tags["provisionerd:cluster"], 8), doc["op_id"])
        seen = self.records.get("ops", doc["op_id"])
        if seen is not None and seen["ask"] != ask:
            raise PluginError("invalid_request", f"op_id {doc['op_id']!r} was already used for a different request")
        return request_id, None if seen is None else seen["requestId"]

    def request_machines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        template, count = asked_template(self.templates, doc)
        with self.records.exclusive():
            request_id, replayed = self._replay(doc, "req", [template.template_id, count])
            if replayed:
                return {"requestId": replayed, "message": "op_id seen before: the same machines"}
            ids = []
            for boot in doc["bootstrap"][:count]:  # the join token is handed to the machine, never kept
                machine_id = f"{PREFIX}-{record_name(doc['op_id'] + boot['instanceRef'], 12)}"
                tags = {**owner_tags(doc), INSTANCE_TAG: boot["instanceRef"]}
                record = {"machineId": machine_id, "name": machine_id, "launchtime": int(time.time()), "tags": tags}
                self.records.put("machines", machine_id, record)
                ids.append(machine_id)
            self.records.put("requests", request_id, {"machines": ids})
            self.records.put("ops", doc["op_id"], {"requestId": request_id, "ask": [template.template_id, count]})
        return {"requestId": request_id}

    def status(self, request_id: str) -> dict[str, Any]:
        parsed = parse_request_id(PREFIX, request_id)
        record = self.records.get("requests", request_id) if parsed else None
        if parsed is None or record is None:
            return unknown_request(request_id)
        if parsed[0] == "ret":
            return return_status(request_id, record["machines"])
        live = [self.records.get("machines", m) for m in record["machines"]]
        machines = tuple(_machine(m) for m in live if m is not None)
        return RequestStatus(request_id, "complete", machines, f"{len(machines)} running").to_contract()

    def request_return(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        cluster = owner_tags(doc)["provisionerd:cluster"]
        with self.records.exclusive():
            ask = sorted(m["machineId"] for m in doc["machines"])
            request_id, replayed = self._replay(doc, "ret", ask)
            if replayed:
                return {"requestId": replayed}
            entries = []
            for ref in doc["machines"]:
                record = self.records.get("machines", ref["machineId"])
                if record is not None and record["tags"].get("provisionerd:cluster") != cluster:
                    entry = {"result": "fail", "status": "untouched", "message": "another cluster's machine"}
                else:  # returning a machine that is gone already is harmless
                    self.records.drop("machines", ref["machineId"])
                    entry = {"result": "succeed", "status": "terminated"}
                entries.append({"machineId": ref["machineId"], "name": ref["name"], **entry})
            self.records.put("requests", request_id, {"machines": entries})
            self.records.put(
                "ops", doc["op_id"], {"requestId": request_id, "ask": sorted(m["machineId"] for m in doc["machines"])}
            )
        return {"requestId": request_id}

    def list_machines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Keyset pages in machineId order: the cursor is the last machineId of the page before."""
        found = [
            m for m in self.records.machines() if matches(m.tags, doc["tags"]) and m.machine_id > doc.get("cursor", "")
        ]
        size = doc.get("pageSize") or len(found) or 1
        answer: dict[str, Any] = {"machines": [m.listing_entry() for m in found[:size]]}
        if len(found) > size:
            answer["nextCursor"] = found[size - 1].machine_id
        return answer


if __name__ == "__main__":
    sys.exit(main(ExamplePlugin, sys.argv[1:], NAME))
