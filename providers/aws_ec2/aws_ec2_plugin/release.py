"""``requestReturnMachines`` (TerminateInstances) and ``stopMachines`` (StopInstances), in batches.

Only instances carrying our ``provisionerd:cluster`` tag are ever touched: the given ids are first described with
that tag as a filter, and ids that do not match (untagged, another cluster's, unknown) are reported and left alone.
Each batch is first tagged with the request's op_id (``provisionerd:return-op`` / ``provisionerd:stop-op``), then
terminated or stopped. The tag makes the request pollable by any daemon host and tells our returns apart from the
cloud's reclaims in ``getReturnRequests``. Instances already on their way (terminated, or stopped for a stop) are
counted as done and not called again; EC2's own calls are idempotent for them anyway.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aws_ec2_plugin import bootstrap
from aws_ec2_plugin.ec2ops import Ec2, chunks
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.machines import RETURN, STOP, state_of
from aws_ec2_plugin.records import Records

log = logging.getLogger(__name__)

_DONE_STATES = {
    RETURN: frozenset({"shutting-down", "terminated"}),
    STOP: frozenset({"stopping", "stopped", "shutting-down", "terminated"}),
}
_TAG = {RETURN: bootstrap.TAG_RETURN_OP, STOP: bootstrap.TAG_STOP_OP}


def release(
    ec2: Ec2, records: Records, kind: str, op_id: str, cluster: str, ids: list[str], batch_size: int
) -> dict[str, Any]:
    """Terminate (``kind`` RETURN) or stop (STOP) our instances among ``ids``; ``{"requestId": op_id, "message"}``.

    On a failure part-way the error says how far it got; the same op_id again finishes the job.
    """
    ours = ec2.describe_values("instance-id", ids, [{"Name": f"tag:{bootstrap.TAG_CLUSTER}", "Values": [cluster]}])
    states = {instance["InstanceId"]: state_of(instance) for instance in ours}
    ignored = [i for i in ids if i not in states]
    done = {i: s for i, s in states.items() if s in _DONE_STATES[kind]}
    todo = [i for i in ids if i in states and i not in done]

    previous = records.load(op_id) or {}
    record = {
        "kind": kind,
        "ids": sorted(set(previous.get("ids", [])) | set(states)),
        "done": {**previous.get("done", {}), **done},
        "ignored": ignored,
        "updated": time.time(),
    }
    _save(records, op_id, record)

    batches = 0
    for batch in chunks(todo, batch_size):
        try:
            ec2.create_tags(batch, {_TAG[kind]: op_id})
            (ec2.terminate if kind == RETURN else ec2.stop)(batch)
        except PluginError as err:
            err.message = f"after {batches} of {-(-len(todo) // batch_size)} batches: {err.message}"
            raise
        batches += 1

    verb = "terminating" if kind == RETURN else "stopping"
    message = f"{verb} {len(todo)} machines in {batches} batches; {len(done)} already done"
    if ignored:
        message += f"; {len(ignored)} not ours or unknown, left untouched: {', '.join(ignored[:20])}"
    return {"requestId": op_id, "message": message}


def _save(records: Records, op_id: str, record: dict[str, Any]) -> None:
    try:
        records.save(op_id, record)
    except OSError as exc:
        log.warning("cannot write the request record for %s: %s", op_id, exc.strerror)
