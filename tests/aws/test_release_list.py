"""Listing, returning, stopping and reclaim detection against the EC2 emulator."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.process


def _ids(plugin, ec2, op_id):
    return sorted(i["InstanceId"] for i in plugin.instances(ec2, **{"provisionerd:op": op_id}))


def _foreign_instances(ec2, plugin):
    """An untagged instance and one of another cluster, both running."""
    untagged = ec2.run_instances(ImageId="ami-0123456789abcdef0", InstanceType="t3.micro", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    other = ec2.run_instances(
        ImageId="ami-0123456789abcdef0",
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "provisionerd:cluster", "Value": plugin.cluster + "-other"},
                    {"Key": "provisionerd:op", "Value": "op-list"},
                ],
            }
        ],
    )["Instances"][0]["InstanceId"]
    return untagged, other


def _state(ec2, instance_id):
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservations[0]["Instances"][0]["State"]["Name"]


def test_listing_and_return_touch_only_our_tagged_instances(shared, ec2):
    plugin, p = shared
    untagged, other = _foreign_instances(ec2, plugin)
    p.call("requestMachines", plugin.request_input("op-list", 2))
    p.call("requestMachines", plugin.request_input("op-list2", 1))
    ours = _ids(plugin, ec2, "op-list") + _ids(plugin, ec2, "op-list2")
    listed = p.call("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}})["result"]["machines"]
    narrowed = p.call("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster, "provisionerd:op": "op-list"}})[
        "result"
    ]["machines"]
    # A return naming foreign ids leaves them alone and says so.
    returned = p.call("requestReturnMachines", plugin.return_input("ret-list", [ours[0], untagged, other]))["result"]
    after = p.call("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}})["result"]["machines"]
    assert sorted(m["machineId"] for m in listed) == sorted(ours)
    assert sorted(m["machineId"] for m in narrowed) == _ids(plugin, ec2, "op-list")
    assert all(m["tags"]["provisionerd:cluster"] == plugin.cluster for m in listed)
    assert "2 not ours or unknown, left untouched" in returned["message"]
    assert _state(ec2, untagged) == "running" and _state(ec2, other) == "running"
    assert _state(ec2, ours[0]) == "terminated"
    assert sorted(m["machineId"] for m in after) == sorted(ours[1:])  # terminated ones are not listed


def test_termination_runs_in_batches_and_is_idempotent(plugin, ec2):
    plugin.write_config(terminate_batch_size=3)
    with plugin.persistent() as p:
        p.call("requestMachines", plugin.request_input("op-seven", 7))
        ids = _ids(plugin, ec2, "op-seven")
        assert len(ids) == 7
        first = p.call("requestReturnMachines", plugin.return_input("ret-seven", ids))["result"]
        again = p.call("requestReturnMachines", plugin.return_input("ret-seven", ids))["result"]
        status = p.call("getRequestStatus", {"requests": [{"requestId": "ret-seven"}]})["result"]["requests"][0]
    assert first == {"requestId": "ret-seven", "message": "terminating 7 machines in 3 batches; 0 already done"}
    assert again["message"] == "terminating 0 machines in 0 batches; 7 already done"
    assert [c["ids"] for c in plugin.calls("TerminateInstances")] == [3, 3, 1]
    assert [c["ids"] for c in plugin.calls("CreateTags")] == [3, 3, 1]
    assert {_state(ec2, i) for i in ids} == {"terminated"}
    assert status["status"] == "complete"
    assert sorted(m["machineId"] for m in status["machines"]) == ids
    assert {(m["result"], m["status"]) for m in status["machines"]} == {("succeed", "terminated")}


def test_returning_already_terminated_machines_is_harmless(shared, ec2):
    plugin, p = shared
    p.call("requestMachines", plugin.request_input("op-gone", 2))
    ids = _ids(plugin, ec2, "op-gone")
    ec2.terminate_instances(InstanceIds=[ids[0]])
    out = p.call("requestReturnMachines", plugin.return_input("ret-gone", ids))["result"]
    status = p.call("getRequestStatus", {"requests": [{"requestId": "ret-gone"}]})["result"]["requests"][0]
    assert out["message"] == "terminating 1 machines in 1 batches; 1 already done"
    assert status["status"] == "complete" and len(status["machines"]) == 2
    assert [c["ids"] for c in plugin.calls("TerminateInstances")] == [1]


def test_stop_and_reclaim_detection(shared, ec2):
    """Stopped by us: not a reclaim. Terminated by someone else: reclaimed now. Marked: reclaimed with grace."""
    plugin, p = shared
    p.call("requestMachines", plugin.request_input("op-rc", 4))
    stopped, killed, marked, fine = _ids(plugin, ec2, "op-rc")
    stop = p.call("stopMachines", plugin.return_input("stop-rc", [stopped]))["result"]
    ec2.terminate_instances(InstanceIds=[killed])  # e.g. a spot interruption or a console user
    ec2.create_tags(Resources=[marked], Tags=[{"Key": "provisionerd:reclaim", "Value": "30"}])
    machines = [{"name": i, "machineId": i} for i in (stopped, killed, marked, fine)]
    wanted = p.call("getReturnRequests", {"machines": machines})["result"]
    stop_status = p.call("getRequestStatus", {"requests": [{"requestId": "stop-rc"}]})["result"]
    nothing = p.call("getReturnRequests", {"machines": []})["result"]
    assert stop["requestId"] == "stop-rc"
    assert _state(ec2, stopped) == "stopped"
    assert stop_status["requests"][0]["status"] == "complete"
    assert stop_status["requests"][0]["machines"][0]["status"] == "stopped"
    got = {r["machineId"]: r["gracePeriod"] for r in wanted["requests"]}
    assert got == {killed: 0, marked: 30}
    assert nothing["requests"] == []


def test_many_requests_in_flight_on_the_persistent_transport(plugin, ec2):
    with plugin.persistent() as p:
        p.call("requestMachines", plugin.request_input("op-par", 2))
        sent = [p.send("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster}}) for _ in range(4)]
        sent.append(p.send("getRequestStatus", {"requests": [{"requestId": "op-par"}]}))
        sent.append(p.send("describeProvider", {}))
        replies = {r["id"]: r for r in (p.receive() for _ in sent)}
        p.proc.stdin.write(b"this is not json\n")
        p.proc.stdin.flush()
        bad = p.proc.stdout.readline()
        plugin.outputs.append(bad.decode())
        assert p.close() == 0
    assert sorted(replies) == sorted(sent)
    assert all("result" in r for r in replies.values())
    assert len(replies[sent[0]]["result"]["machines"]) == 2
    assert b'"id": null' in bad and b"invalid_request" in bad


def _pages(p, action, inp, size):
    pages, cursor = [], None
    for _ in range(30):
        answer = p.call(action, {**inp, "pageSize": size, **({"cursor": cursor} if cursor else {})})["result"]
        pages.append(answer)
        cursor = answer.get("nextCursor")
        if cursor is None:
            return pages
    raise AssertionError("no last page in 30")


def test_listing_and_reclaims_page_through_ec2s_own_next_token(plugin, ec2):
    with plugin.persistent() as p:
        p.call("requestMachines", plugin.request_input("op-pages", 7))
        ours = _ids(plugin, ec2, "op-pages")
        cluster = {"tags": {"provisionerd:cluster": plugin.cluster}}
        for size in (1, 3, 5, 7, 50):
            plugin.set_faults()  # a fresh call log per size
            plugin.reset_calls()
            pages = _pages(p, "listMachines", cluster, size)
            ids = [m["machineId"] for page in pages for m in page["machines"]]
            assert sorted(ids) == ours, size  # no duplicate, none missing
            assert all(len(page["machines"]) <= size for page in pages), size
            calls = plugin.calls("DescribeInstances")
            assert calls and all(c["max_results"] >= 5 for c in calls), calls  # EC2's MaxResults, never below 5
            if size >= 5:  # a page EC2 gave whole: one DescribeInstances per page, each after the first by token
                assert [c["token"] for c in calls] == [False] + [True] * (len(calls) - 1), (size, calls)
        bad = p.call("listMachines", {**cluster, "pageSize": 2, "cursor": "no-such-cursor"})
        assert bad["error"]["code"] == "invalid_request"

        killed, marked = ours[:2]
        ec2.terminate_instances(InstanceIds=[killed])
        ec2.create_tags(Resources=[marked], Tags=[{"Key": "provisionerd:reclaim", "Value": "30"}])
        pages = _pages(p, "getReturnRequests", {"machines": [{"name": i, "machineId": i} for i in ours]}, 1)
        assert [[r["machineId"] for r in page["requests"]] for page in pages] == [[killed], [marked]]
