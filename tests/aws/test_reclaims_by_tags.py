"""``features.reclaimsByTags`` against the EC2 emulator: ``getReturnRequests`` asked by the cluster tag with no
machine named answers every instance of the cluster the provider wants back, and only those."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.process

RECLAIM_TAG = "provisionerd:reclaim"


def _ids(plugin, ec2, op_id):
    return sorted(i["InstanceId"] for i in plugin.instances(ec2, **{"provisionerd:op": op_id}))


def _other_cluster(ec2, cluster, count):
    """``count`` running instances of another cluster (tagged the way the plugin tags its own)."""
    tags = [{"Key": "provisionerd:cluster", "Value": cluster}, {"Key": "provisionerd:op", "Value": "op-other"}]
    out = ec2.run_instances(
        ImageId="ami-0123456789abcdef0",
        InstanceType="t3.micro",
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return sorted(i["InstanceId"] for i in out["Instances"])


def _by_tags(p, cluster, **more):
    doc = {"machines": [], "tags": {"provisionerd:cluster": cluster}, **more}
    reply = p.call("getReturnRequests", doc)
    assert "result" in reply, reply
    return reply["result"]


def _wanted(result):
    return {r["machineId"]: r["gracePeriod"] for r in result["requests"]}


def test_asked_by_the_cluster_tag_it_names_the_clusters_machines_wanted_back_and_no_others(shared, ec2):
    plugin, p = shared
    p.call("requestMachines", plugin.request_input("op-bt", 6))
    marked, stopped, killed, returned, stopped_by_us, fine = _ids(plugin, ec2, "op-bt")
    ec2.create_tags(Resources=[marked], Tags=[{"Key": RECLAIM_TAG, "Value": "45"}])
    ec2.stop_instances(InstanceIds=[stopped])  # someone else (a console user, an OS shutdown)
    ec2.terminate_instances(InstanceIds=[killed])  # a spot interruption
    assert "result" in p.call("requestReturnMachines", plugin.return_input("ret-bt", [returned]))
    assert "result" in p.call("stopMachines", plugin.return_input("stop-bt", [stopped_by_us]))
    # Another cluster's machines, wanted back the same ways: never in our cluster's answer.
    other = plugin.cluster + "-other"
    other_marked, other_stopped = _other_cluster(ec2, other, 2)
    ec2.create_tags(Resources=[other_marked], Tags=[{"Key": RECLAIM_TAG, "Value": "45"}])
    ec2.stop_instances(InstanceIds=[other_stopped])

    ours = _by_tags(p, plugin.cluster)
    theirs = _by_tags(p, other)
    named_only = p.call("getReturnRequests", {"machines": []})["result"]
    # The named machines' answer and the tags' answer merge, each machine once.
    both = p.call(
        "getReturnRequests",
        {
            "machines": [{"name": i, "machineId": i} for i in (marked, fine)],
            "tags": {"provisionerd:cluster": plugin.cluster},
        },
    )["result"]
    # Narrower tags narrow the answer (every tag must match).
    narrowed = _by_tags(p, plugin.cluster, tags={"provisionerd:cluster": plugin.cluster, RECLAIM_TAG: "45"})
    listed = p.call("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}})["result"]["machines"]

    assert _wanted(ours) == {marked: 45, stopped: 0, killed: 0}
    assert _wanted(theirs) == {other_marked: 45, other_stopped: 0}
    assert named_only["requests"] == []
    assert [r["machineId"] for r in both["requests"]] == sorted({marked, stopped, killed})
    assert _wanted(narrowed) == {marked: 45}
    # What the kit checks: a machine wanted back with time left is one listMachines shows under the same tags.
    assert marked in {m["machineId"] for m in listed}


def test_by_tags_answers_page_by_machine_id(shared, ec2):
    plugin, p = shared
    p.call("requestMachines", plugin.request_input("op-bt-page", 3))
    ids = _ids(plugin, ec2, "op-bt-page")
    ec2.create_tags(Resources=ids, Tags=[{"Key": RECLAIM_TAG, "Value": "x"}])  # not a number: the default grace
    seen, cursor, pages = [], None, 0
    while True:
        result = _by_tags(p, plugin.cluster, pageSize=2, **({"cursor": cursor} if cursor else {}))
        pages += 1
        seen += [r["machineId"] for r in result["requests"]]
        assert {r["gracePeriod"] for r in result["requests"]} == {120}
        cursor = result.get("nextCursor")
        if not cursor:
            break
    assert seen == ids and pages == 2


def test_tags_must_name_the_cluster(shared):
    plugin, p = shared
    for tags in ({}, {"provisionerd:op": "op-x"}, {"provisionerd:cluster": 7}):
        reply = p.call("getReturnRequests", {"machines": [], "tags": tags})
        assert reply.get("error", {}).get("code") == "invalid_request", (tags, reply)


def test_describe_provider_declares_reclaims_by_tags(plugin):
    assert plugin.ok("describeProvider", {})["features"]["reclaimsByTags"] is True
