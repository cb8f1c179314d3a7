"""``requestReturnMachines`` (scancel of our own jobs only) and ``getReturnRequests`` (what Slurm took from us).

Return: a job is cancelled only when slurmctld reports it as this user's job with our tags for the same cluster and
provider; the cancel itself is bound to the job name the tags imply (``scancel --name``). Before cancelling, the
job's comment gets ``provisionerd:returned=<op_id>`` and a marker goes into the data directory, so that later a
CANCELLED state reads as "returned", not as "reclaimed". Returning twice is harmless: a job that is gone or over
needs nothing, and every call re-issues the cancel for a job that is still live (so a retry after a lost answer
finishes the job). Anything without our tags is reported as refused and left alone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from slurm_plugin import jobs as jobmod
from slurm_plugin import tags as tagmod
from slurm_plugin.cluster import SlurmCluster
from slurm_plugin.config import Config
from slurm_plugin.status import keyset_page
from slurm_plugin.store import Store
from slurm_plugin.submit import live_keys, remove_token, request_id_for, sweep_tokens


def request_return(config: Config, cluster: SlurmCluster, store: Store, doc: Mapping[str, Any]) -> dict[str, Any]:
    owner = doc["tags"]
    request_id = request_id_for("ret", owner[tagmod.CLUSTER], doc["op_id"])
    with store.locked(request_id):
        jobs = cluster.my_jobs()
        sweep_tokens(config, live_keys(jobs.values()), time.time())
        entries = []
        cancelled = 0
        for ref in doc["machines"]:
            job_id = ref["machineId"]
            record = jobs.get(job_id)
            entry: dict[str, Any] = {"machineId": job_id, "name": ref["name"]}
            if record is not None and not (
                record.tags
                and record.tags.get(tagmod.CLUSTER) == owner[tagmod.CLUSTER]
                and record.tags.get(tagmod.PROVIDER) == owner[tagmod.PROVIDER]
            ):
                entry["refused"] = f"job {job_id} does not carry this cluster's and provider's tags: not touched"
            elif record is not None:
                assert record.tags is not None
                machine_tags = {k: v for k, v in record.tags.items() if k != tagmod.RETURNED}
                entry.update(
                    tags=machine_tags,
                    name=tagmod.job_name(machine_tags),
                    launchtime=record.start_time or record.submit_time or 0,
                )
                if record.live:
                    store.mark_returned(job_id)
                    if not record.returned:
                        cluster.set_comment(job_id, tagmod.with_returned(machine_tags, doc["op_id"]))
                    cluster.cancel(job_id, tagmod.job_name(machine_tags))
                    cancelled += 1
                remove_token(config, machine_tags)
            # else: slurmctld does not know the job (purged or never ours): nothing exists to cancel
            entries.append(entry)
        store.save({"requestId": request_id, "kind": "ret", "opId": doc["op_id"], "machines": entries})
    refused = sum(1 for e in entries if "refused" in e)
    message = f"cancelled {cancelled} pilot job(s)" + (f"; refused {refused} not ours" if refused else "")
    return {"requestId": request_id, "message": message}


def get_return_requests(config: Config, cluster: SlurmCluster, store: Store, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The machines among ``doc["machines"]`` that Slurm took (cancelled by someone else, preempted, node failure,
    time limit, ...) or is about to take (time limit within ``reclaimNoticeSeconds``: ``gracePeriod`` is the time
    left). A job slurmctld lists without our tags is not reported; one it has forgotten (and accounting too) is
    reported as "gone"."""
    jobs = cluster.my_jobs()
    asked = [m for m in doc["machines"] if m["machineId"].isdigit()]
    purged = cluster.accounting(m["machineId"] for m in asked if m["machineId"] not in jobs)
    wanted = []
    for m in asked:
        job_id = m["machineId"]
        record = jobs.get(job_id) or purged.get(job_id)
        if record is not None and record.source == "squeue" and record.tags is None:
            continue  # a job without our tags (the daemon only asks about machines it got from us)
        found = jobmod.reclaim_reason(record, store.is_returned(job_id), config.reclaim_notice)
        if found is None:
            continue
        reason, grace = found
        if record is not None and record.tags and grace == 0:
            remove_token(config, record.tags)  # over: an agent that never started will not read it
        wanted.append(
            {
                "machine": m["name"],
                "machineId": job_id,
                "gracePeriod": grace,
                "reason": reason,
                "message": _describe(job_id, record, reason),
            }
        )
    page, cursor = keyset_page(wanted, doc)
    message = f"{len(wanted)} machine(s) taken back by Slurm"
    return {"status": "complete", "message": message, "requests": page, **cursor}


def _describe(job_id: str, record: jobmod.JobRecord | None, reason: str) -> str:
    if record is None:
        return f"job {job_id} is gone from slurmctld and has no accounting record"
    if reason == "time_limit":
        return f"job {job_id} reaches its time limit in {record.time_left} s"
    return jobmod.outcome(job_id, record, False).message
