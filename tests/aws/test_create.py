"""requestMachines against the EC2 emulator: idempotency per op_id, unknown outcomes, bootstrap placement."""

from __future__ import annotations

import collections

import pytest

pytestmark = pytest.mark.process


def test_same_op_id_twice_creates_the_machines_once(shared, ec2):
    plugin, p = shared
    doc = plugin.request_input("op-twice", 3)
    first = p.call("requestMachines", doc)
    second = p.call("requestMachines", doc)
    status = p.call("getRequestStatus", {"requests": [{"requestId": "op-twice"}]})
    assert first["result"]["requestId"] == second["result"]["requestId"] == "op-twice"
    assert "3 launched" in first["result"]["message"] and "0 launched" in second["result"]["message"]
    instances = plugin.instances(ec2, **{"provisionerd:op": "op-twice"})
    assert len(instances) == 3
    assert len(plugin.calls("RunInstances")) == 3
    request = status["result"]["requests"][0]
    assert request["status"] == "complete"
    assert sorted(m["instanceRef"] for m in request["machines"]) == ["op-twice-m0", "op-twice-m1", "op-twice-m2"]
    assert {m["result"] for m in request["machines"]} == {"succeed"}
    assert all(isinstance(m["launchtime"], int) and m["launchtime"] > 0 for m in request["machines"])


def test_retry_after_crash_mid_request_creates_no_duplicates(plugin, ec2):
    """The plugin dies right after EC2 launched the 2nd machine: the caller never learns the outcome. The retry
    with the same op_id (from another process, with a fresh data dir as after a failover) finds the two by tag
    and launches only the third."""
    doc = plugin.request_input("op-crash", 3)
    plugin.set_faults({"operation": "RunInstances", "action": "crash_after_response", "skip": 1, "times": 1})
    rc, out = plugin.oneshot("requestMachines", doc)
    assert rc == 70 and out is None
    assert len(plugin.instances(ec2, **{"provisionerd:op": "op-crash"})) == 2

    plugin.set_faults()
    for path in plugin.data_dir.rglob("*.json"):
        path.unlink()  # the new lease holder has no local record: the tags alone must suffice
    with plugin.persistent() as p:
        retry = p.call("requestMachines", doc)["result"]
        again = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-crash"}]})["result"]["requests"][0]
    assert "1 launched, 2 already existed" in retry["message"]
    assert "0 launched, 3 already existed" in again["message"]
    instances = plugin.instances(ec2, **{"provisionerd:op": "op-crash"})
    refs = collections.Counter(plugin.tags_of(i)["provisionerd:instance"] for i in instances)
    assert refs == {"op-crash-m0": 1, "op-crash-m1": 1, "op-crash-m2": 1}
    assert status["status"] == "complete" and len(status["machines"]) == 3


def test_bootstrap_is_in_user_data_and_never_in_tags(shared, ec2):
    plugin, p = shared
    doc = plugin.request_input("op-boot", 2)
    tokens = {b["instanceRef"]: b["joinToken"] for b in doc["bootstrap"]}
    p.call("requestMachines", doc)
    listing = p.call("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}})
    status = p.call("getRequestStatus", {"requests": [{"requestId": "op-boot"}]})
    instances = plugin.instances(ec2, **{"provisionerd:op": "op-boot"})
    assert len(instances) == 2
    for instance in instances:
        tags = plugin.tags_of(instance)
        ref = tags["provisionerd:instance"]
        assert tags["provisionerd:cluster"] == plugin.cluster
        assert tags["provisionerd:epoch"] == "3.7" and tags["provisionerd:provider"] == "aws"
        assert not any(token in k or token in v for token in tokens.values() for k, v in tags.items())
        data = plugin.user_data(ec2, instance["InstanceId"])
        assert data["provisionerd"]["joinToken"] == tokens[ref]  # each machine its own token
        assert data["provisionerd"]["instanceRef"] == ref
        assert data["provisionerd"]["controllers"] == ["ctl.example:7443"]
        assert data["userData"] == {"site": "test"}
    assert not any(t in str(listing) + str(status) for t in tokens.values())


def test_capacity_error_maps_and_creates_nothing(plugin, ec2):
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "InsufficientInstanceCapacity",
            "http_status": 500,
            "message": "We currently do not have sufficient c5.xlarge capacity",
        }
    )
    error = plugin.error("requestMachines", plugin.request_input("op-nocap", 2))
    assert error["code"] == "capacity_unavailable" and error["retryable"] is True
    assert "InsufficientInstanceCapacity" in error["message"]
    assert plugin.instances(ec2, **{"provisionerd:op": "op-nocap"}) == []


def test_partial_capacity_accepts_what_launched_and_reports_the_rest(plugin, ec2):
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "InsufficientInstanceCapacity",
            "http_status": 500,
            "skip": 1,
        }
    )
    doc = plugin.request_input("op-part", 3)
    with plugin.persistent() as p:
        out = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-part"}]})["result"]["requests"][0]
    assert "1 launched" in out["message"] and "2 of 3 not launched: capacity_unavailable" in out["message"]
    assert len(plugin.calls("RunInstances")) == 2  # stopped at the first refusal instead of hammering
    assert status["status"] == "complete_with_error" and len(status["machines"]) == 1
    assert "capacity_unavailable" in status["message"]

    plugin.set_faults()  # capacity is back: the same op_id fills the gap, and only the gap
    with plugin.persistent() as p:
        out = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-part"}]})["result"]["requests"][0]
    assert "2 launched, 1 already existed" in out["message"]
    assert status["status"] == "complete" and len(status["machines"]) == 3
    assert len(plugin.instances(ec2, **{"provisionerd:op": "op-part"})) == 3


def test_unknown_template_and_bad_bootstrap_are_invalid_requests(plugin):
    doc = plugin.request_input("op-bad", 2)
    with plugin.persistent() as p:
        unknown = p.call("requestMachines", {**doc, "template": {"templateId": "nope", "machineCount": 2}})
        short = p.call("requestMachines", {**doc, "bootstrap": doc["bootstrap"][:1]})
        too_many = p.call("requestMachines", {**plugin.request_input("op-big", 21)})
        foreign = p.call("requestMachines", {**doc, "tags": {**doc["tags"], "provisionerd:cluster": "other"}})
    for reply in (unknown, short, too_many, foreign):
        assert reply["error"]["code"] == "invalid_request" and reply["error"]["retryable"] is False
    assert "maxNumber" in too_many["error"]["message"]
    assert plugin.calls("RunInstances") == []


def test_concurrent_calls_with_one_op_id_create_the_machines_once(shared, ec2):
    """Two in flight at once on the persistent transport (a retry racing the original): serialised per op_id."""
    plugin, p = shared
    doc = plugin.request_input("op-race", 2)
    ids = [p.send("requestMachines", doc), p.send("requestMachines", doc)]
    replies = [p.receive(), p.receive()]
    assert sorted(r["id"] for r in replies) == sorted(ids)
    assert sorted(r["result"]["message"][:10] for r in replies) == ["0 launched", "2 launched"]
    assert len(plugin.instances(ec2, **{"provisionerd:op": "op-race"})) == 2


def test_instances_terminate_when_they_halt_and_the_agent_learns_the_orphan_timeout(shared, ec2):
    plugin, p = shared
    doc = plugin.request_input("op-halt", 2)
    doc["bootstrap"][0]["orphanTimeout"] = 600
    p.call("requestMachines", doc)
    instances = sorted(
        plugin.instances(ec2, **{"provisionerd:op": "op-halt"}),
        key=lambda i: plugin.tags_of(i)["provisionerd:instance"],
    )
    assert len(instances) == 2
    for instance in instances:
        behaviour = ec2.describe_instance_attribute(
            InstanceId=instance["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    first, second = (plugin.user_data(ec2, i["InstanceId"])["provisionerd"] for i in instances)
    assert first["orphanTimeout"] == 600 and first["onOrphan"] == "shutdown"
    assert "orphanTimeout" not in second and "onOrphan" not in second


def test_a_bad_orphan_timeout_is_an_invalid_request(plugin):
    doc = plugin.request_input("op-bad-orphan", 1)
    doc["bootstrap"][0]["orphanTimeout"] = -1
    assert plugin.error("requestMachines", doc)["code"] == "invalid_request"
