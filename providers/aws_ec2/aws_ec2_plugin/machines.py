"""Pure decisions over EC2 instance descriptions: contract machine entries, request states, reclaims.

No I/O here. Inputs are the dictionaries boto3 returns from DescribeInstances (``LaunchTime`` a ``datetime``) and
plain values; ``now`` is passed in where age matters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aws_ec2_plugin.bootstrap import TAG_INSTANCE, TAG_RETURN_OP, TAG_STOP_OP, TAG_TEMPLATE, tag_dict

#: ``(template id, instance type) -> configured price or None`` (``Config.quote``).
Quote = Callable[[str, str], Mapping[str, Any] | None]

LIVE_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})

# request kinds
CREATE, RETURN, STOP = "create", "return", "stop"

_CREATE_RESULT = {
    "pending": "executing",
    "running": "succeed",
    "shutting-down": "fail",
    "terminated": "fail",
    "stopping": "fail",
    "stopped": "fail",
}


def state_of(instance: Mapping[str, Any]) -> str:
    return str(instance.get("State", {}).get("Name", "unknown"))


def listed(instance: Mapping[str, Any]) -> dict[str, Any]:
    """A ``listMachines`` entry, with ``instanceType``: the type EC2 really launched (a template may list several)."""
    entry = {
        "machineId": instance["InstanceId"],
        "name": instance.get("PrivateDnsName") or instance["InstanceId"],
        "status": state_of(instance),
        "launchtime": _epoch_seconds(instance.get("LaunchTime")),
        "privateIpAddress": instance.get("PrivateIpAddress"),
        "tags": tag_dict(instance),
    }
    if instance.get("InstanceType"):
        entry["instanceType"] = instance["InstanceType"]
    return entry


def result_for(kind: str, state: str) -> tuple[str, str]:
    """``(result, message)`` of one machine in a request of ``kind`` whose instance is in EC2 ``state``."""
    if kind == CREATE:
        result = _CREATE_RESULT.get(state, "executing")
        return result, ("" if result != "fail" else f"instance is {state}")
    if kind == RETURN:
        return ("succeed", "") if state == "terminated" else ("executing", "")
    if state == "stopped":
        return "succeed", ""
    if state in ("shutting-down", "terminated"):
        return "fail", f"instance is {state}, not stopped"
    return "executing", ""


def status_machine(kind: str, instance: Mapping[str, Any], quote: Quote | None = None) -> dict[str, Any]:
    """A ``getRequestStatus`` machine entry for an instance described by EC2; with ``quote``, the configured price
    of its template's machines of the type it really got (``price``, the contract's price shape)."""
    state = state_of(instance)
    result, message = result_for(kind, state)
    entry = listed(instance)
    entry.update(
        result=result, message=_with_reason(message, instance), instanceRef=entry["tags"].get(TAG_INSTANCE, "")
    )
    price = quote(entry["tags"].get(TAG_TEMPLATE, ""), entry.get("instanceType", "")) if quote else None
    if price is not None:
        entry["price"] = dict(price)
    return entry


def unseen_machine(kind: str, machine_id: str, instance_ref: str, age: float, grace: float) -> dict[str, Any]:
    """An entry for a machine this host knows about but DescribeInstances does not show.

    Just after RunInstances that is EC2's eventual consistency (still executing, for ``grace`` seconds); for a
    return, an instance that is gone from the listing is long terminated (EC2 keeps terminated ones ~1 hour).
    """
    base = {"machineId": machine_id, "name": machine_id, "privateIpAddress": None, "instanceRef": instance_ref}
    if kind == RETURN:
        return base | {"result": "succeed", "status": "terminated", "message": "no longer listed by EC2"}
    if age < grace:
        return base | {"result": "executing", "status": "pending", "message": "not yet visible in DescribeInstances"}
    return base | {
        "result": "fail",
        "status": "unknown",
        "message": f"not visible in DescribeInstances after {int(age)} s",
    }


def rolled_back_machine(machine_id: str, instance_ref: str) -> dict[str, Any]:
    """An entry for a machine an all-or-nothing request launched and terminated (it fell short) that
    DescribeInstances does not show: failed, whatever its visibility."""
    return {
        "machineId": machine_id,
        "name": machine_id,
        "privateIpAddress": None,
        "instanceRef": instance_ref,
        "result": "fail",
        "status": "terminated",
        "message": "terminated: the all-or-nothing request fell short",
    }


def request_status(machines: Sequence[Mapping[str, Any]], failed_slots: int) -> tuple[str, str]:
    """``(status, message)`` of a request from its machine entries and the slots that could not be launched."""
    results = [m["result"] for m in machines]
    if "executing" in results:
        return "running", ""
    failures = results.count("fail") + failed_slots
    if failures:
        return "complete_with_error", f"{failures} of {len(results) + failed_slots} machines failed"
    return "complete", ""


def kind_of(request_id: str, tags: Mapping[str, str]) -> str:
    """Which request of an instance ``request_id`` names, from the tag that carries it."""
    if tags.get(TAG_RETURN_OP) == request_id:
        return RETURN
    if tags.get(TAG_STOP_OP) == request_id:
        return STOP
    return CREATE


def reclaimed(instances: Iterable[Mapping[str, Any]], reclaim_tag: str, default_grace: int) -> list[dict[str, Any]]:
    """The machines the cloud (or an operator) wants back: ``getReturnRequests`` entries.

    - an instance stopping/stopped/shutting-down/terminated that we never asked to return or stop (no
      ``provisionerd:return-op``/``stop-op`` tag): EC2 reclaimed it (spot interruption, host retirement, an OS
      shutdown) or someone else acted on it. Grace 0: it is already going.
    - an instance carrying ``reclaim_tag``: an operator or an automation (say, an EventBridge rule on the spot
      two-minute warning) asks for it; the tag's value is the grace period if it is a number.
    """
    wanted: list[dict[str, Any]] = []
    for instance in instances:
        tags = tag_dict(instance)
        state = state_of(instance)
        if TAG_RETURN_OP in tags or (TAG_STOP_OP in tags and state in ("stopping", "stopped")):
            continue  # what we asked for (a machine we stopped and EC2 then terminated is still reported)
        name = instance.get("PrivateDnsName") or instance["InstanceId"]
        if state in GONE_STATES:
            grace = 0
        elif reclaim_tag in tags:
            value = tags[reclaim_tag].strip()
            grace = int(value) if value.isdigit() and len(value) < 7 else default_grace
        else:
            continue
        wanted.append({"machine": name, "machineId": instance["InstanceId"], "gracePeriod": grace})
    return wanted


def _with_reason(message: str, instance: Mapping[str, Any]) -> str:
    reason = instance.get("StateReason", {}).get("Message") or ""
    if message and reason:
        return f"{message}: {reason}"[:1000]
    return message


def _epoch_seconds(value: Any) -> int:
    if value is None:
        return 0
    return max(0, int(value.timestamp()))
