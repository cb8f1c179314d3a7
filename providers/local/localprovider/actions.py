"""The contract's actions for machines that are worker-agent processes on this host.

Every call holds the state lock, first sweeps (a returned agent that is gone becomes ``returned``; one that ignored
SIGTERM for ``killGraceSeconds`` gets SIGKILL) and then answers from two sources: the records (what we started and
why) and a scan of ``/proc`` (what is really running; see ``procs.py``). A record is never trusted for liveness:
a record says ``running`` and the process is gone means the agent died on its own.

Join tokens go from the input straight into the agent's stdin and nowhere else: not into records, logs, argv,
environment or any answer.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from localprovider import conf as conf_mod
from localprovider import procs
from localprovider.spawn import FAILED, spawn_agent
from localprovider.store import (
    RETURNED,
    RETURNING,
    RUNNING,
    STARTING,
    Store,
    create_request_id,
    machine_id_for,
    return_request_id,
)
from provisionerd.plugin_sdk.errors import PluginError

NAME, VERSION = "local", "1.0.0"
ADDRESS = re.compile(r"^\S+:[0-9]{1,5}$")


def _bad(message: str) -> PluginError:
    return PluginError("invalid_request", message)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value or not value.isprintable():
        raise _bad(f"{what} must be a non-empty printable string")
    return value


def _tags(doc: Mapping[str, Any]) -> dict[str, str]:
    tags = doc.get("tags")
    if not isinstance(tags, dict) or not isinstance(tags.get("provisionerd:cluster"), str):
        raise _bad("tags must be an object naming provisionerd:cluster")
    for key, value in tags.items():
        _text(key, "a tag key")
        if "=" in key or not isinstance(value, str) or "\0" in value:
            raise _bad(f"tag {key!r}: keys may not contain '=', values must be strings")
    return dict(tags)


class Provider:
    def __init__(self, env: Mapping[str, str], *, persistent: bool = False) -> None:
        self.env = env
        self.store = Store(env.get("PRO_DATA_DIR", ""))
        self.persistent = persistent
        self.home = str(self.store.root)

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        handler = ACTIONS.get(action)
        if handler is None:
            raise _bad(f"unknown action {action!r}")
        if not isinstance(doc, dict):
            raise _bad("the input must be a JSON object")
        conf = conf_mod.load(self.env.get("PRO_CONF_DIR", ""), self.home)
        with self.store.locked():
            if self.persistent:
                procs.reap_children()
            agents = procs.scan_agents(self.home)
            self._sweep(conf, agents)
            return handler(self, conf, doc, agents)

    # --- liveness --------------------------------------------------------------------------------------------

    @staticmethod
    def _alive(record: Mapping[str, Any], agents: Mapping[str, procs.AgentProc]) -> bool:
        """The machine's agent is running: the scan found this very process (pid and start time) as our agent.
        What may be signalled (``_return``, ``_sweep``) is decided by this alone."""
        agent = agents.get(record["machineId"])
        return agent is not None and (agent.pid, agent.starttime) == (record.get("pid"), record.get("starttime"))

    @classmethod
    def _not_dead(cls, record: Mapping[str, Any], agents: Mapping[str, procs.AgentProc]) -> bool:
        """``_alive``, or the scan found no agent for it and the very process started for it (pid and start time)
        still exists: a status does not call a machine dead on a command line it could not read. (What the scan
        took for a second agent, a child the agent forked and has not exec'd yet, is ``procs.scan_agents``'s to
        leave out.) Only a status uses this."""
        if record["machineId"] in agents:
            return cls._alive(record, agents)
        pid, starttime = record.get("pid"), record.get("starttime")
        return bool(pid) and bool(starttime) and procs.is_running(int(pid), int(starttime))

    def _sweep(self, conf: conf_mod.Conf, agents: dict[str, procs.AgentProc]) -> None:
        now = time.time()
        for record in self.store.machines():
            agent = agents.get(record["machineId"])
            if record["state"] == STARTING and agent is not None:
                record.update(state=RUNNING, pid=agent.pid, starttime=agent.starttime)  # started, then we crashed
                self.store.put_machine(record)
            elif record["state"] == RETURNING and not self._alive(record, agents):
                record.update(state=RETURNED, endedAt=int(now))
                self.store.put_machine(record)
            elif record["state"] == RETURNING and now - record.get("termSentAt", now) > conf.kill_grace:
                procs.signal_agent(record["pid"], record["starttime"], signal.SIGKILL)

    def _live_count(self, template_id: str, agents: Mapping[str, procs.AgentProc]) -> int:
        return sum(1 for r in self.store.machines() if r["templateId"] == template_id and self._alive(r, agents))

    # --- describe, templates ---------------------------------------------------------------------------------

    def describe(self, conf: conf_mod.Conf, doc: Any, agents: Any) -> dict[str, Any]:
        features = {
            "idempotentRequest": True,
            "listMachines": True,
            "stopMachines": False,
            "tags": True,
            "priceQuotes": any(t.price is not None for t in conf.templates),
            # A request that does not fit the template's room is refused whole (request_machines): all or nothing.
            "allOrNothing": True,
        }
        return {"name": NAME, "version": VERSION, "contractVersion": 1, "features": features}

    def templates(self, conf: conf_mod.Conf, doc: Any, agents: Any) -> dict[str, Any]:
        return {
            "templates": [
                t.document(max(0, t.max_number - self._live_count(t.template_id, agents))) for t in conf.templates
            ]
        }

    # --- create ----------------------------------------------------------------------------------------------

    def request_machines(self, conf: conf_mod.Conf, doc: dict[str, Any], agents: Any) -> dict[str, Any]:
        template_doc = doc.get("template") or {}
        template = conf.template(str(template_doc.get("templateId", "")))
        if template is None:
            raise _bad(f"unknown templateId {template_doc.get('templateId')!r}")
        count = template_doc.get("machineCount")
        op_id = _text(doc.get("op_id"), "op_id")
        tags = _tags(doc)
        boots = doc.get("bootstrap")
        if not isinstance(count, int) or count < 1 or not isinstance(boots, list) or len(boots) != count:
            raise _bad("machineCount must be >= 1 with exactly one bootstrap entry per machine")
        for boot in boots:
            if not isinstance(boot, dict) or not isinstance(boot.get("joinToken"), str):
                raise _bad("each bootstrap entry needs instanceRef, controllers and joinToken")
            _text(boot.get("instanceRef"), "bootstrap instanceRef")
            controllers = boot.get("controllers")
            if (
                not isinstance(controllers, list)
                or not controllers
                or not all(isinstance(c, str) and ADDRESS.match(c) for c in controllers)
            ):
                raise _bad("bootstrap controllers must be a non-empty list of HOST:PORT")
        refs = [boot["instanceRef"] for boot in boots]
        if len(set(refs)) != len(refs):
            raise _bad("bootstrap instanceRefs must be unique")
        request_id = create_request_id(op_id)
        existing = self.store.request(request_id)
        if existing is not None:
            if existing["templateId"] != template.template_id or existing["instanceRefs"] != refs:
                raise _bad(f"op_id {op_id!r} was already used for another request")
            self._start_missing(conf, existing, tags, boots, agents)
            return {
                "requestId": request_id,
                "message": f"op_id {op_id!r} already requested: same request, no new machines",
            }
        available = template.max_number - self._live_count(template.template_id, agents)
        if count > available:
            raise PluginError("quota_exceeded", f"template {template.template_id!r}: {available} more agents allowed")
        record = {
            "requestId": request_id,
            "kind": "create",
            "opId": op_id,
            "templateId": template.template_id,
            "instanceRefs": refs,
            "machineIds": [machine_id_for(op_id, r) for r in refs],
            "createdAt": int(time.time()),
        }
        self.store.put_request(record)  # first: a crash from here on is completed by a replay of the op_id
        self._start_missing(conf, record, tags, boots, agents)
        return {"requestId": request_id, "message": f"requested {count} x {template.template_id}"}

    def _start_missing(
        self,
        conf: conf_mod.Conf,
        request: dict[str, Any],
        tags: dict[str, str],
        boots: list[dict[str, Any]],
        agents: Mapping[str, procs.AgentProc],
    ) -> None:
        """Start each machine of ``request`` that was never started (a first call, or one cut short)."""
        for boot, machine_id in zip(boots, request["machineIds"], strict=True):
            record = self.store.machine(machine_id)
            if record is not None and (record["state"] != STARTING or machine_id in agents):
                continue
            record = {
                "machineId": machine_id,
                "name": machine_id,
                "instanceRef": boot["instanceRef"],
                "templateId": request["templateId"],
                "opId": request["opId"],
                "requestId": request["requestId"],
                "tags": {**tags, "provisionerd:instance": boot["instanceRef"]},
                "state": STARTING,
                "pid": 0,
                "starttime": 0,
                "launchtime": int(time.time()),
            }
            self.store.put_machine(record)
            spawn_agent(conf, record, boot, self.store)

    # --- status ----------------------------------------------------------------------------------------------

    def request_status(self, conf: conf_mod.Conf, doc: dict[str, Any], agents: Any) -> dict[str, Any]:
        requests = doc.get("requests")
        if not isinstance(requests, list):
            raise _bad("requests must be a list")
        answers = []
        for item in requests:
            request_id = item.get("requestId") if isinstance(item, dict) else None
            record = self.store.request(request_id) if isinstance(request_id, str) else None
            if record is None:
                answers.append(
                    {
                        "requestId": str(request_id),
                        "status": "complete_with_error",
                        "message": "unknown request",
                        "machines": [],
                    }
                )
                continue
            if record["kind"] == "create":
                machines = [self._create_entry(mid, agents) for mid in record["machineIds"]]
            else:
                machines = [self._return_entry(entry, agents) for entry in record["machines"]]
            results = {m["result"] for m in machines}
            status = "running" if "executing" in results else "complete_with_error" if "fail" in results else "complete"
            answers.append({"requestId": request_id, "status": status, "message": "", "machines": machines})
        return {"requests": answers}

    def _entry(self, record: Mapping[str, Any], result: str, status: str, message: str = "") -> dict[str, Any]:
        return {
            "machineId": record["machineId"],
            "name": record.get("name", record["machineId"]),
            "result": result,
            "status": status,
            "privateIpAddress": "127.0.0.1",
            "launchtime": record.get("launchtime", 0),
            "message": message,
            "instanceRef": record.get("instanceRef", ""),
            "tags": record.get("tags", {}),
        }

    def _create_entry(self, machine_id: str, agents: Mapping[str, procs.AgentProc]) -> dict[str, Any]:
        record = self.store.machine(machine_id)
        if record is None or record["state"] == STARTING:
            stub = record or {"machineId": machine_id}
            return self._entry(
                stub,
                "fail",
                "unknown",
                "never started (the call was cut short): repeat the request with the same op_id",
            )
        state = record["state"]
        if state == FAILED:
            return self._entry(record, "fail", "terminated", record.get("message", ""))
        if state == RUNNING:
            if self._not_dead(record, agents):
                return self._entry(record, "succeed", "running")
            return self._entry(record, "fail", "terminated", f"the agent exited on its own (logs/{machine_id}.log)")
        return self._entry(record, "succeed", "shutting-down" if state == RETURNING else "terminated")

    def _return_entry(self, entry: Mapping[str, Any], agents: Mapping[str, procs.AgentProc]) -> dict[str, Any]:
        record = self.store.machine(entry["machineId"]) or {"machineId": entry["machineId"], "name": entry["name"]}
        if entry.get("refused"):
            return self._entry(record, "fail", "running", entry["refused"])
        if "state" in record and self._alive(record, agents):
            return self._entry(record, "executing", "shutting-down")
        return self._entry(record, "succeed", "terminated")

    # --- return ----------------------------------------------------------------------------------------------

    def request_return(self, conf: conf_mod.Conf, doc: dict[str, Any], agents: Any) -> dict[str, Any]:
        op_id = _text(doc.get("op_id"), "op_id")
        cluster = _tags(doc)["provisionerd:cluster"]
        machines = doc.get("machines")
        if not isinstance(machines, list) or not machines:
            raise _bad("machines must be a non-empty list")
        request_id = return_request_id(op_id)
        if self.store.request(request_id) is not None:
            return {"requestId": request_id, "message": f"op_id {op_id!r} already requested: same return"}
        entries = []
        for item in machines:
            machine_id = _text(item.get("machineId") if isinstance(item, dict) else None, "machineId")
            entries.append(
                {
                    "machineId": machine_id,
                    "name": str(item.get("name", "")),
                    "refused": self._return_one(machine_id, cluster, request_id, agents),
                }
            )
        self.store.put_request({"requestId": request_id, "kind": "return", "opId": op_id, "machines": entries})
        return {"requestId": request_id, "message": f"returning {len(entries)} machine(s)"}

    def _return_one(self, machine_id: str, cluster: str, request_id: str, agents: Mapping[str, procs.AgentProc]) -> str:
        """Signal one agent to stop; the reason it is refused, or ``""``."""
        record = self.store.machine(machine_id)
        agent = agents.get(machine_id)
        if record is None and agent is not None:  # ours, started by a call that never recorded it: adopt it
            record = {
                "machineId": machine_id,
                "name": machine_id,
                "instanceRef": agent.instance_ref,
                "templateId": "",
                "opId": agent.tags.get("provisionerd:op", ""),
                "requestId": "",
                "tags": agent.tags,
                "state": RUNNING,
                "pid": agent.pid,
                "starttime": agent.starttime,
                "launchtime": procs.launch_epoch(agent.starttime),
            }
        if record is None:
            return ""  # unknown or long gone: returning it is harmless
        if record.get("tags", {}).get("provisionerd:cluster") != cluster:
            return "this machine is not tagged for the caller's cluster: not touched"
        if record["state"] in (RETURNING, RETURNED):
            return ""
        if record["state"] in (RUNNING, STARTING) and self._alive(record, agents):
            procs.signal_agent(record["pid"], record["starttime"], signal.SIGTERM)
            record.update(state=RETURNING, termSentAt=time.time())
        else:
            record.update(state=RETURNED, endedAt=int(time.time()))
        record["returnRequestId"] = request_id
        self.store.put_machine(record)
        return ""

    def return_requests(self, conf: conf_mod.Conf, doc: dict[str, Any], agents: Any) -> dict[str, Any]:
        machines = doc.get("machines")
        if not isinstance(machines, list):
            raise _bad("machines must be a list")
        asked = {m["machineId"]: m.get("name", "") for m in machines if isinstance(m, dict) and "machineId" in m}
        wanted = []
        known = set()
        for record in self.store.machines():
            known.add(record["machineId"])
            died = record["state"] == RUNNING and not self._alive(record, agents)
            if died and (not asked or record["machineId"] in asked):
                wanted.append({"machine": record["name"], "machineId": record["machineId"], "gracePeriod": 0})
        for machine_id, name in sorted(asked.items()):
            if machine_id not in known and machine_id not in agents:
                wanted.append({"machine": name or machine_id, "machineId": machine_id, "gracePeriod": 0})
        page, cursor = _page(sorted(wanted, key=lambda w: w["machineId"]), doc)
        return {"status": "complete", "message": "", "requests": page, **cursor}

    # --- listing ---------------------------------------------------------------------------------------------

    def list_machines(self, conf: conf_mod.Conf, doc: dict[str, Any], agents: Any) -> dict[str, Any]:
        wanted = doc.get("tags")
        if not isinstance(wanted, dict) or "provisionerd:cluster" not in wanted:
            raise _bad("tags must name provisionerd:cluster")
        listed = []
        for machine_id, agent in sorted(agents.items()):
            if any(agent.tags.get(k) != v for k, v in wanted.items()):
                continue
            record = self.store.machine(machine_id) or {}
            returning = record.get("state") == RETURNING
            listed.append(
                {
                    "machineId": machine_id,
                    "name": record.get("name", machine_id),
                    "status": "shutting-down" if returning else "running",
                    "launchtime": record.get("launchtime") or procs.launch_epoch(agent.starttime),
                    "privateIpAddress": "127.0.0.1",
                    "tags": agent.tags,
                }
            )
        page, cursor = _page(listed, doc)  # listed in machineId order
        return {"machines": page, **cursor}


def _page(entries: list[dict[str, Any]], doc: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Keyset paging of ``listMachines`` and ``getReturnRequests`` (docs/providers.md, "Paging"): of ``entries``
    (in machineId order), those after ``doc["cursor"]``, at most ``doc["pageSize"]``, and ``{"nextCursor": ...}``
    (the page's last id) when more follow. Without ``pageSize``: everything, and no cursor."""
    cursor, size = doc.get("cursor"), doc.get("pageSize")
    if cursor is not None and (not isinstance(cursor, str) or not cursor):
        raise _bad("cursor must be a non-empty string")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise _bad("pageSize must be an integer >= 1")
    after = entries if cursor is None else [e for e in entries if e["machineId"] > cursor]
    if size is None or len(after) <= size:
        return after, {}
    return after[:size], {"nextCursor": after[size - 1]["machineId"]}


ACTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "describeProvider": Provider.describe,
    "getAvailableTemplates": Provider.templates,
    "requestMachines": Provider.request_machines,
    "getRequestStatus": Provider.request_status,
    "requestReturnMachines": Provider.request_return,
    "getReturnRequests": Provider.return_requests,
    "listMachines": Provider.list_machines,
}
