"""``getRequestStatus`` and ``getReturnRequests``: DescribeInstances read through the pure rules of ``machines``.

A request id is the op_id of a create, return or stop request. One DescribeInstances with a ``tag-value`` filter
finds the instances of up to 200 requests at once; the tag that carries the id (``provisionerd:op``,
``provisionerd:return-op`` or ``provisionerd:stop-op``) says which kind of request it was. This host's record adds
what tags cannot say (failed launch slots, ids not visible yet, returns of already terminated machines, the
machines an all-or-nothing request terminated when it fell short).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from aws_ec2_plugin import machines
from aws_ec2_plugin.bootstrap import TAG_CLUSTER, TAG_OP, TAG_RETURN_OP, TAG_STOP_OP, tag_dict
from aws_ec2_plugin.ec2ops import MAX_INSTANCES, Ec2, tag_filters
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.records import Records

_ID_TAGS = (TAG_OP, TAG_RETURN_OP, TAG_STOP_OP)


def cluster_filter(cluster: str | None) -> list[dict[str, Any]]:
    """Our cluster's instances; without a known cluster name, at least instances with a cluster tag at all."""
    if cluster:
        return [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    return [{"Name": "tag-key", "Values": [TAG_CLUSTER]}]


def request_status(
    ec2: Ec2,
    records: Records,
    request_ids: Sequence[str],
    cluster: str | None,
    visibility_grace: float,
    quote: machines.Quote | None = None,
) -> dict[str, Any]:
    found = ec2.describe_values("tag-value", sorted(set(request_ids)), cluster_filter(cluster))
    by_request: dict[str, list[Mapping[str, Any]]] = {rid: [] for rid in request_ids}
    for instance in found:
        tags = tag_dict(instance)
        for key in _ID_TAGS:
            if tags.get(key) in by_request:
                by_request[tags[key]].append(instance)
    now = time.time()
    return {
        "requests": [_one(rid, by_request[rid], records.load(rid), now, visibility_grace, quote) for rid in request_ids]
    }


def _one(
    request_id: str,
    instances: Sequence[Mapping[str, Any]],
    record: Mapping[str, Any] | None,
    now: float,
    grace: float,
    quote: machines.Quote | None,
) -> dict[str, Any]:
    if not instances and record is None:
        return {
            "requestId": request_id,
            "status": "complete_with_error",
            "machines": [],
            "message": "unknown request: no machine carries this request id",
        }
    if record is not None:
        kind = str(record.get("kind", machines.CREATE))
    else:
        kind = machines.kind_of(request_id, tag_dict(instances[0]))
    entries = [
        machines.status_machine(kind, i, quote) for i in instances if machines.kind_of(request_id, tag_dict(i)) == kind
    ]
    seen = {e["machineId"] for e in entries}
    failed_slots = 0
    if record is not None:
        age = now - float(record.get("updated", now))
        if kind == machines.CREATE:
            rolled_back = dict(record.get("rolledBack", {}))
            for ref, machine_id in dict(record.get("launched", {})).items():
                if machine_id in seen:
                    continue
                if ref in rolled_back:  # terminated by this plugin: never "not yet visible"
                    entries.append(machines.rolled_back_machine(machine_id, ref))
                else:
                    entries.append(machines.unseen_machine(kind, machine_id, ref, age, grace))
            failed_slots = len(record.get("failed", {}))
        else:
            done = dict(record.get("done", {}))
            for machine_id in record.get("ids", []):
                if machine_id in seen:
                    continue
                if machine_id in done:
                    result, message = machines.result_for(kind, done[machine_id])
                    entries.append(
                        {
                            "machineId": machine_id,
                            "name": machine_id,
                            "result": result,
                            "status": done[machine_id],
                            "message": message or "already done",
                        }
                    )
                else:
                    entries.append(machines.unseen_machine(kind, machine_id, "", age, grace))
    status, message = machines.request_status(entries, failed_slots)
    if failed_slots and record is not None:
        codes = sorted(set(dict(record["failed"]).values()))
        message = f"{message}; not launched: {', '.join(codes)}"
    return {"requestId": request_id, "status": status, "message": message, "machines": entries}


def return_requests(
    ec2: Ec2,
    ids: Sequence[str],
    cluster: str | None,
    reclaim_tag: str,
    default_grace: int,
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The given machines the cloud reclaimed or an operator marked; see :func:`machines.reclaimed`.

    With ``tags`` (``features.reclaimsByTags``), also every instance carrying all of them that is wanted back, named
    in ``ids`` or not: found by filters, not by ids (see :func:`tagged_candidates`). Each machine is answered once.
    """
    if not ids and tags is None:
        return {"status": "complete", "message": "", "requests": []}
    found: dict[str, Mapping[str, Any]] = {}
    if ids:
        found.update((i["InstanceId"], i) for i in ec2.describe_values("instance-id", ids, cluster_filter(cluster)))
    if tags is not None:
        found.update((i["InstanceId"], i) for i in tagged_candidates(ec2, tags, reclaim_tag))
    wanted = machines.reclaimed(found.values(), reclaim_tag, default_grace)
    if tags is None:
        message = f"{len(wanted)} of {len(ids)} machines wanted back"
    else:
        message = f"{len(wanted)} machines wanted back ({len(ids)} named, the others by tags)"
    return {"status": "complete", "message": message, "requests": wanted}


def tagged_candidates(ec2: Ec2, tags: Mapping[str, str], reclaim_tag: str) -> list[Mapping[str, Any]]:
    """The instances carrying all ``tags`` that :func:`machines.reclaimed` may want back: those carrying the
    reclaim tag, and those in a gone state (two DescribeInstances queries, merged by InstanceId). At most
    ``MAX_INSTANCES`` of them (the bound of a listing)."""
    scope = tag_filters(tags)
    marked = ec2.describe([*scope, {"Name": "tag-key", "Values": [reclaim_tag]}])
    gone = ec2.describe([*scope, {"Name": "instance-state-name", "Values": sorted(machines.GONE_STATES)}])
    merged = {i["InstanceId"]: i for i in (*marked, *gone)}
    if len(merged) > MAX_INSTANCES:
        raise PluginError("provider_error", f"DescribeInstances matched more than {MAX_INSTANCES} instances")
    return list(merged.values())
