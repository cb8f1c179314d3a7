"""Batch launches and instance-type fallover against the EC2 emulator (moto_server), the plugin a real process.

What the emulator does not check, so these tests cannot either: it ignores ClientToken (the op-tag lookup is what
keeps a retry from duplicating), never runs out of capacity (InsufficientInstanceCapacity is injected by the
plugin's fault hook, per instance type), launches ``MinCount`` instances always, evaluates no IAM policy and has no
real prices. It does give every instance of a RunInstances its ``AmiLaunchIndex`` and applies TagSpecifications at
creation, which is what the batch path rests on.
"""

from __future__ import annotations

import collections
import time

import pytest

pytestmark = pytest.mark.process

TYPES = ("c5.xlarge", "m5.xlarge", "r5.xlarge")


def price(amount: float) -> dict[str, object]:
    return {
        "amount": amount,
        "currency": "USD",
        "unit": "hour",
        "source": "test sheet",
        "timestamp": "2026-12-01T00:00:00Z",
    }


def batch_template(plugin, **changes: object) -> None:
    template = {**plugin.config["templates"][0], "join": "address-bound", "maxNumber": 200, **changes}
    plugin.write_config(templates=[template])


def daemon_refs(doc: dict, op_id: str) -> dict:
    """The daemon names a request's machines ``<op_id>/<i>`` (provisionerd.domain.tokens.instance_refs)."""
    for i, entry in enumerate(doc["bootstrap"]):
        entry["instanceRef"] = f"{op_id}/{i}"
    return doc


def test_a_demand_of_100_is_one_launch_call_and_every_instance_is_tagged_at_creation(plugin, ec2):
    batch_template(plugin)
    doc = daemon_refs(plugin.request_input("op-100", 100), "op-100")
    with plugin.persistent() as p:
        started = time.monotonic()
        out = p.call("requestMachines", doc)["result"]
        launch_seconds = time.monotonic() - started
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-100"}]})["result"]["requests"][0]
        again = p.call("requestMachines", doc)["result"]
    launches = plugin.calls("RunInstances")
    assert [(c["count"], c["instance_type"]) for c in launches] == [(100, "c5.xlarge")]
    assert plugin.calls("CreateTags") == []  # every tag came with the launch
    assert "100 launched, 0 already existed" in out["message"] and "0 launched, 100 already existed" in again["message"]
    print(f"demand 100: {len(launches)} RunInstances, requestMachines {launch_seconds:.2f} s")

    instances = plugin.instances(ec2, **{"provisionerd:op": "op-100"})
    assert len(instances) == 100
    owner = plugin.owner_tags("op-100")
    for instance in instances:
        tags = plugin.tags_of(instance)
        assert {k: tags[k] for k in owner} == owner and tags["provisionerd:template"] == "c5-xlarge"
    assert status["status"] == "complete"
    refs = collections.Counter(m["instanceRef"] for m in status["machines"])
    assert refs == {f"op-100/{i}": 1 for i in range(100)}
    assert all(m["tags"]["provisionerd:instance"] == m["instanceRef"] for m in status["machines"])

    # One user-data for all: no join token, no machine named in it.
    tokens = [b["joinToken"] for b in doc["bootstrap"]]
    documents = {str(plugin.user_data(ec2, i["InstanceId"])) for i in instances[:10]}
    assert len(documents) == 1
    text = documents.pop()
    assert not any(t in text for t in tokens)
    data = plugin.user_data(ec2, instances[0]["InstanceId"])
    assert data["provisionerd"] == {
        "version": 2,
        "join": "address-bound",
        "controllers": ["ctl.example:7443"],
        "cluster": plugin.cluster,
    }


def test_a_lost_batch_answer_is_retried_without_duplicates_from_the_tags_alone(plugin, ec2):
    """Batches of 4: the plugin dies right after EC2 launched the 2nd batch. The retry, from another process
    without this host's records (a new lease holder), finds 8 machines by tag and launches the last 2 in one call."""
    plugin.write_config(launch_batch_size=4)
    batch_template(plugin)
    doc = daemon_refs(plugin.request_input("op-lost", 10), "op-lost")
    plugin.set_faults({"operation": "RunInstances", "action": "crash_after_response", "skip": 1, "times": 1})
    rc, out = plugin.oneshot("requestMachines", doc)
    assert rc == 70 and out is None
    assert len(plugin.instances(ec2, **{"provisionerd:op": "op-lost"})) == 8

    plugin.set_faults()
    plugin.reset_calls()
    for path in plugin.data_dir.rglob("*.json"):
        path.unlink()
    with plugin.persistent() as p:
        retry = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-lost"}]})["result"]["requests"][0]
    assert "2 launched, 8 already existed" in retry["message"]
    assert [c["count"] for c in plugin.calls("RunInstances")] == [2]
    assert status["status"] == "complete"
    assert sorted(m["instanceRef"] for m in status["machines"]) == sorted(f"op-lost/{i}" for i in range(10))


@pytest.mark.parametrize("join", ["address-bound", "token"])
def test_a_capacity_error_on_the_first_type_is_filled_from_the_next_in_the_same_call(plugin, ec2, join):
    """Three instance types; EC2 has no c5.xlarge (InsufficientInstanceCapacity, injected for that type only):
    the one requestMachines call fills the request with m5.xlarge, and each machine says what it got and costs."""
    batch_template(
        plugin,
        instanceType=None,
        instanceTypes=[
            {"instanceType": t, "price": price(p)} for t, p in zip(TYPES, (0.17, 0.192, 0.252), strict=True)
        ],
        join=join,
    )
    del plugin.config["templates"][0]["instanceType"]
    plugin.write_config()
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "InsufficientInstanceCapacity",
            "http_status": 500,
            "message": "We currently do not have sufficient c5.xlarge capacity",
            "match": {"InstanceType": "c5.xlarge"},
        }
    )
    doc = daemon_refs(plugin.request_input("op-types", 5), "op-types")
    with plugin.persistent() as p:
        out = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-types"}]})["result"]["requests"][0]
        offer = p.call("getAvailableTemplates", {})["result"]["templates"][0]
    asked = [c["instance_type"] for c in plugin.calls("RunInstances")]
    if join == "address-bound":
        assert asked == ["c5.xlarge", "m5.xlarge"]  # one refusal, then the whole batch on the next type
    else:
        assert asked == ["c5.xlarge"] + ["m5.xlarge"] * 5  # the refused type is not asked again for the rest
    assert (
        "5 launched" in out["message"]
        and "c5.xlarge in the default subnet: InsufficientInstanceCapacity" in out["message"]
    )
    assert status["status"] == "complete" and len(status["machines"]) == 5
    assert {m["instanceType"] for m in status["machines"]} == {"m5.xlarge"}
    assert {m["price"]["amount"] for m in status["machines"]} == {0.192}
    assert {i["InstanceType"] for i in plugin.instances(ec2, **{"provisionerd:op": "op-types"})} == {"m5.xlarge"}
    assert offer["price"]["amount"] == 0.252  # the offer states the dearest type: the cost cap holds for any


def test_every_type_refused_is_one_capacity_error_naming_them_all(plugin, ec2):
    batch_template(plugin, instanceTypes=[{"instanceType": t} for t in TYPES])
    del plugin.config["templates"][0]["instanceType"]
    plugin.write_config()
    plugin.set_faults(
        {"operation": "RunInstances", "action": "error", "code": "InsufficientInstanceCapacity", "http_status": 500}
    )
    error = plugin.error("requestMachines", daemon_refs(plugin.request_input("op-none", 3), "op-none"))
    assert error["code"] == "capacity_unavailable" and error["retryable"] is True
    assert all(t in error["message"] for t in TYPES)
    assert len(plugin.calls("RunInstances")) == 3
    assert plugin.instances(ec2, **{"provisionerd:op": "op-none"}) == []


def test_capacity_that_runs_out_after_a_batch_keeps_it_and_the_same_op_fills_the_rest(plugin, ec2):
    plugin.write_config(launch_batch_size=4)
    batch_template(plugin)
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "InsufficientInstanceCapacity",
            "http_status": 500,
            "skip": 1,
        }
    )
    doc = daemon_refs(plugin.request_input("op-short", 10), "op-short")
    with plugin.persistent() as p:
        out = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-short"}]})["result"]["requests"][0]
    assert "4 launched" in out["message"] and "6 of 10 not launched: capacity_unavailable" in out["message"]
    assert status["status"] == "complete_with_error" and len(status["machines"]) == 4
    assert sorted(m["instanceRef"] for m in status["machines"]) == [f"op-short/{i}" for i in range(4)]

    plugin.set_faults()
    plugin.reset_calls()
    with plugin.persistent() as p:
        out = p.call("requestMachines", doc)["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-short"}]})["result"]["requests"][0]
    assert "6 launched, 4 already existed" in out["message"]
    assert [c["count"] for c in plugin.calls("RunInstances")] == [4, 2]
    assert status["status"] == "complete"
    assert sorted(m["instanceRef"] for m in status["machines"]) == sorted(f"op-short/{i}" for i in range(10))
