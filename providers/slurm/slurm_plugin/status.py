"""The read-only actions: ``getRequestStatus`` (creation and return requests) and ``listMachines``.

A creation request's machines come from the plugin's record and, when that is missing (another daemon host, a lost
data directory), from the jobs carrying the request's op tag. Each job's state becomes a result through
``jobs.outcome``; jobs slurmctld has purged are looked up in accounting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisionerd.plugin_sdk.documents import request_status, unknown_request
from provisionerd.plugin_sdk.errors import PluginError
from slurm_plugin import jobs as jobmod
from slurm_plugin import tags as tagmod
from slurm_plugin.cluster import SlurmCluster
from slurm_plugin.config import Config
from slurm_plugin.jobs import JobRecord
from slurm_plugin.store import Store
from slurm_plugin.submit import parse_request_id, remove_token


def _machine(
    job_id: str,
    record: JobRecord | None,
    machine_tags: Mapping[str, str],
    result: jobmod.Outcome,
    addresses: Mapping[str, str],
) -> dict[str, Any]:
    node = record.nodes if record else ""
    launch = (record.start_time or record.submit_time) if record else None
    entry: dict[str, Any] = {
        "machineId": job_id,
        "name": tagmod.job_name(machine_tags),
        "result": result.result,
        "status": result.status,
        "privateIpAddress": addresses.get(node) if node else None,
        "launchtime": launch or 0,
        "message": result.message,
        "instanceRef": machine_tags.get(tagmod.INSTANCE, ""),
        "tags": dict(machine_tags),
        "node": node,  # ext: the Slurm node the pilot runs on ("" while queued)
        "slurmState": record.state if record else "UNKNOWN",  # ext
    }
    return entry


def _creation(
    config: Config,
    cluster: SlurmCluster,
    store: Store,
    request_id: str,
    chash: str,
    op_id: str,
    jobs: dict[str, JobRecord],
) -> dict[str, Any]:
    saved = store.load(request_id)
    wanted: dict[str, str] = {}  # instanceRef -> job id
    owner: dict[str, str] | None = saved["tags"] if saved else None
    if saved:
        wanted.update(saved["machines"])
    for record in jobs.values():
        t = record.tags
        if (
            t is None
            or record.rejected
            or t.get(tagmod.OP) != op_id
            or tagmod.cluster_hash(t[tagmod.CLUSTER]) != chash
            or tagmod.INSTANCE not in t
        ):
            continue
        wanted.setdefault(t[tagmod.INSTANCE], record.job_id)
        owner = owner or {k: t[k] for k in (tagmod.CLUSTER, tagmod.PROVIDER, tagmod.OP, tagmod.EPOCH) if k in t}
    if not wanted or owner is None:
        return unknown_request(request_id, "unknown request: no record and no job carries its op tag")
    purged = cluster.accounting(j for j in wanted.values() if j not in jobs)
    need_addresses = any(jobs.get(j) and jobs[j].nodes for j in wanted.values())
    addresses = cluster.node_addresses() if need_addresses else {}
    machines = []
    for ref, job_id in sorted(wanted.items(), key=lambda kv: int(kv[1])):
        record = jobs.get(job_id) or purged.get(job_id)
        machine_tags = {**owner, tagmod.INSTANCE: ref}
        if record is not None and record.tags:
            machine_tags = {k: v for k, v in record.tags.items() if k != tagmod.RETURNED}
        result = jobmod.outcome(job_id, record, store.is_returned(job_id))
        if result.status in ("terminated", "unknown"):
            remove_token(config, machine_tags)
        machines.append(_machine(job_id, record, machine_tags, result, addresses))
    results = sorted({m["result"] for m in machines})
    return request_status(
        request_id, machines, ", ".join(f"{sum(m['result'] == r for m in machines)} {r}" for r in results)
    )


def _return(store: Store, request_id: str, jobs: dict[str, JobRecord]) -> dict[str, Any]:
    saved = store.load(request_id)
    if saved is None:
        return unknown_request(request_id)
    machines = []
    for m in saved["machines"]:
        record = jobs.get(m["machineId"])
        if m.get("refused"):
            result, status, message = "fail", "untouched", m["refused"]
        elif record is not None and record.live:
            result, status = "executing", record.state.lower()
            message = f"job {record.job_id} is ending ({record.state})"
        else:
            state = record.state if record else "gone from slurmctld"
            result, status, message = "succeed", "terminated", f"job {m['machineId']} is over ({state})"
        entry = {
            "machineId": m["machineId"],
            "name": m["name"],
            "result": result,
            "status": status,
            "message": message,
            "privateIpAddress": None,
            "launchtime": m.get("launchtime", 0),
        }
        if m.get("tags"):
            entry["tags"] = m["tags"]
            entry["instanceRef"] = m["tags"].get(tagmod.INSTANCE, "")
        machines.append(entry)
    return request_status(
        request_id, machines, f"{sum(m['result'] == 'succeed' for m in machines)} of {len(machines)} returned"
    )


def get_request_status(config: Config, cluster: SlurmCluster, store: Store, doc: Mapping[str, Any]) -> dict[str, Any]:
    jobs = cluster.my_jobs()  # one squeue for all the requests asked about; raises (throttled) when unreachable
    out = []
    for item in doc["requests"]:
        request_id = item["requestId"]
        parsed = parse_request_id(request_id)
        if parsed is None:
            out.append(
                {
                    "requestId": request_id,
                    "status": "complete_with_error",
                    "machines": [],
                    "message": "unknown request: not an id this plugin made",
                }
            )
        elif parsed[0] == "req":
            out.append(_creation(config, cluster, store, request_id, parsed[1], parsed[2], jobs))
        else:
            out.append(_return(store, request_id, jobs))
    return {"requests": out}


def list_machines(config: Config, cluster: SlurmCluster, doc: Mapping[str, Any]) -> dict[str, Any]:
    jobs = cluster.my_jobs()
    wanted = dict(doc["tags"])
    listed = [r for r in cluster.owned(jobs, wanted) if r.live]
    addresses = cluster.node_addresses() if any(r.nodes for r in listed) else {}
    machines = []
    for r in sorted(listed, key=lambda r: int(r.job_id)):
        machine_tags = {k: v for k, v in (r.tags or {}).items()}
        machines.append(
            {
                "machineId": r.job_id,
                "name": tagmod.job_name(machine_tags),
                "status": r.state.lower(),
                "launchtime": r.start_time or r.submit_time or 0,
                "privateIpAddress": addresses.get(r.nodes),
                "tags": machine_tags,
                "node": r.nodes,
            }
        )
    page, cursor = keyset_page(machines, doc)  # in job id order already
    return {"machines": page, **cursor}


def keyset_page(entries: list[dict[str, Any]], doc: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Keyset paging of ``listMachines`` and ``getReturnRequests`` (docs/providers.md, "Paging"): ``entries`` in
    job id order after ``doc["cursor"]`` (a job id), at most ``doc["pageSize"]``, and ``{"nextCursor": <the page's
    last job id>}`` when more follow. Without ``pageSize``: everything. The schema checked both fields' types."""
    cursor, size = doc.get("cursor"), doc.get("pageSize")
    if cursor is not None and not str(cursor).isdigit():
        raise PluginError("invalid_request", f"cursor: not a job id this plugin gave: {str(cursor)[:40]!r}")
    ordered = sorted(entries, key=lambda e: int(e["machineId"]))
    after = ordered if cursor is None else [e for e in ordered if int(e["machineId"]) > int(cursor)]
    if size is None or len(after) <= size:
        return after, {}
    return after[:size], {"nextCursor": after[size - 1]["machineId"]}
