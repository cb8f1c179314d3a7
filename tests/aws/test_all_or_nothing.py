"""All-or-nothing requests (``allOrNothing: true``) against the EC2 emulator, the plugin a real process.

The emulator never runs out of capacity: the plugin's fault hook refuses RunInstances (InsufficientInstanceCapacity)
after the first launches, so a request falls short part-way, the case all or nothing is about.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.process

GONE = {"shutting-down", "terminated"}


def capacity_after(plugin, launches: int) -> None:
    """RunInstances succeeds ``launches`` times, then every call (every offering) is refused for capacity."""
    plugin.set_faults(
        {
            "operation": "RunInstances",
            "action": "error",
            "code": "InsufficientInstanceCapacity",
            "http_status": 500,
            "skip": launches,
        }
    )


def whole(doc: dict) -> dict:
    return {**doc, "allOrNothing": True}


def states(plugin, ec2, op_id: str) -> list[str]:
    return sorted(i["State"]["Name"] for i in plugin.instances(ec2, **{"provisionerd:op": op_id}))


def live(plugin, ec2, op_id: str) -> int:
    return sum(1 for state in states(plugin, ec2, op_id) if state not in GONE)


def test_describe_provider_declares_all_or_nothing(plugin):
    assert plugin.ok("describeProvider", {})["features"]["allOrNothing"] is True


@pytest.mark.parametrize("all_or_nothing", [True, False])
def test_a_token_request_refused_at_its_third_machine_keeps_two_or_none(plugin, ec2, all_or_nothing):
    capacity_after(plugin, 2)
    doc = plugin.request_input("op-gang", 3)
    with plugin.persistent() as p:
        reply = p.call("requestMachines", whole(doc) if all_or_nothing else doc)
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-gang"}]})["result"]["requests"][0]
        listed = p.call("listMachines", {"tags": plugin.owner_tags("op-gang")})["result"]["machines"]
    assert len(plugin.calls("RunInstances")) == 3
    assert status["status"] == "complete_with_error"
    if not all_or_nothing:  # as before: what launched is kept and reported
        assert "2 launched" in reply["result"]["message"]
        assert live(plugin, ec2, "op-gang") == 2 and len(listed) == 2
        assert plugin.calls("TerminateInstances") == []
        return
    error = reply["error"]
    assert error["code"] == "capacity_unavailable" and error["retryable"] is True
    assert "all or nothing: the 2 machines this call launched are terminated" in error["message"]
    assert [c["ids"] for c in plugin.calls("TerminateInstances")] == [2]
    assert live(plugin, ec2, "op-gang") == 0 and len(states(plugin, ec2, "op-gang")) == 2
    assert [m for m in listed if m["status"] not in GONE] == []
    # The two it launched and terminated are failed machines; the third a slot never launched.
    assert sorted(m["instanceRef"] for m in status["machines"]) == ["op-gang-m0", "op-gang-m1"]
    assert {m["result"] for m in status["machines"]} == {"fail"}
    assert status["message"] == "3 of 3 machines failed; not launched: capacity_unavailable"


def test_a_replay_of_a_rolled_back_request_launches_nothing_and_refuses_again(plugin, ec2):
    """A machine that existed is never launched again for the same op: the op cannot be made whole, so a replay,
    even with the capacity back, answers the first refusal again (from the record) and launches nothing."""
    capacity_after(plugin, 1)
    doc = whole(plugin.request_input("op-again", 2))
    first = plugin.error("requestMachines", doc)
    plugin.set_faults()
    plugin.reset_calls()
    again = plugin.error("requestMachines", doc)
    assert first["code"] == again["code"] == "capacity_unavailable"
    assert again["message"].startswith(first["message"])
    assert "cannot be made whole" in again["message"]
    assert plugin.calls("RunInstances") == [] and live(plugin, ec2, "op-again") == 0

    for path in plugin.data_dir.rglob("*.json"):
        path.unlink()  # another host, without the record: the tags alone still refuse
    third = plugin.error("requestMachines", doc)
    assert third["code"] == "capacity_unavailable" and "cannot be made whole" in third["message"]
    assert plugin.calls("RunInstances") == [] and live(plugin, ec2, "op-again") == 0


def test_a_replay_after_a_complete_all_or_nothing_request_answers_it_and_creates_nothing(shared, ec2):
    plugin, p = shared
    doc = whole(plugin.request_input("op-done", 3))
    first = p.call("requestMachines", doc)["result"]
    again = p.call("requestMachines", doc)["result"]
    assert first["requestId"] == again["requestId"] == "op-done"
    assert "0 launched, 3 already existed" in again["message"]
    assert len(plugin.calls("RunInstances")) == 3 and plugin.calls("TerminateInstances") == []
    assert live(plugin, ec2, "op-done") == 3


def test_an_earlier_calls_machine_is_kept_and_the_request_accepted_in_part(plugin, ec2):
    """The first call's answer was lost after one launch; the retry launches the second, is refused the third:
    it terminates only the one it launched. The earlier one is live, so the request is accepted in part (the
    daemon returns what a partial answer made) instead of a refusal that would hide it."""
    plugin.set_faults({"operation": "RunInstances", "action": "crash_after_response", "times": 1})
    doc = whole(plugin.request_input("op-lost", 3))
    rc, out = plugin.oneshot("requestMachines", doc)
    assert rc == 70 and out is None and live(plugin, ec2, "op-lost") == 1

    capacity_after(plugin, 1)
    plugin.reset_calls()
    out = plugin.ok("requestMachines", doc)
    assert "1 launched, 1 already existed" in out["message"]
    assert "all or nothing: the 1 machines this call launched are terminated" in out["message"]
    assert [c["ids"] for c in plugin.calls("TerminateInstances")] == [1]
    assert live(plugin, ec2, "op-lost") == 1 and len(states(plugin, ec2, "op-lost")) == 2
    status = plugin.ok("getRequestStatus", {"requests": [{"requestId": "op-lost"}]})["requests"][0]
    assert status["status"] == "complete_with_error"
    assert sorted(m["result"] for m in status["machines"]) == ["fail", "succeed"]


@pytest.mark.parametrize("all_or_nothing", [True, False])
def test_a_batch_request_refused_at_its_second_batch_keeps_the_first_or_none(plugin, ec2, all_or_nothing):
    plugin.write_config(launch_batch_size=4)
    template = {**plugin.config["templates"][0], "join": "address-bound", "maxNumber": 200}
    plugin.write_config(templates=[template])
    capacity_after(plugin, 1)
    doc = plugin.request_input("op-batch", 10)
    for i, entry in enumerate(doc["bootstrap"]):
        entry["instanceRef"] = f"op-batch/{i}"  # the daemon's refs: batches
    with plugin.persistent() as p:
        reply = p.call("requestMachines", whole(doc) if all_or_nothing else doc)
        status = p.call("getRequestStatus", {"requests": [{"requestId": "op-batch"}]})["result"]["requests"][0]
    assert [c["count"] for c in plugin.calls("RunInstances")] == [4, 4]  # the second of 4, 4, 2 is refused
    assert status["status"] == "complete_with_error"
    if not all_or_nothing:
        assert "4 launched" in reply["result"]["message"] and live(plugin, ec2, "op-batch") == 4
        return
    assert reply["error"]["code"] == "capacity_unavailable"
    assert "the 4 machines this call launched are terminated" in reply["error"]["message"]
    assert live(plugin, ec2, "op-batch") == 0 and len(states(plugin, ec2, "op-batch")) == 4
    assert status["message"] == "10 of 10 machines failed; not launched: capacity_unavailable"


def test_all_or_nothing_must_be_a_boolean(plugin):
    error = plugin.error("requestMachines", {**plugin.request_input("op-bool", 1), "allOrNothing": "yes"})
    assert error["code"] == "invalid_request" and "allOrNothing" in error["message"]
    assert plugin.calls("RunInstances") == []


def test_a_termination_ec2_refuses_keeps_the_machines_and_accepts_the_request_in_part(plugin, ec2):
    """A refusal would tell the daemon nothing was made; with a machine still live the honest answer is the
    request accepted in part, so the daemon returns it."""
    refuse_capacity = {
        "operation": "RunInstances",
        "action": "error",
        "code": "InsufficientInstanceCapacity",
        "http_status": 500,
        "skip": 1,
    }
    refuse_terminate = {"operation": "TerminateInstances", "action": "error", "code": "UnauthorizedOperation"}
    plugin.set_faults(refuse_capacity, refuse_terminate)
    out = plugin.ok("requestMachines", whole(plugin.request_input("op-kept", 2)))
    assert "1 launched" in out["message"]
    assert "terminated 0 of the 1 machines this call launched, 1 kept" in out["message"]
    assert live(plugin, ec2, "op-kept") == 1
    status = plugin.ok("getRequestStatus", {"requests": [{"requestId": "op-kept"}]})["requests"][0]
    assert status["status"] == "complete_with_error" and [m["result"] for m in status["machines"]] == ["succeed"]
