"""The simulated provider through its one-shot wrappers: state, determinism and every failure-injection mode."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from plugintest_client import SIMULATED, ok, oneshot, request_input, return_input, write_sim_config

pytestmark = pytest.mark.process


def _status(env, request_id):
    return ok(SIMULATED, "getRequestStatus", {"requests": [{"requestId": request_id}]}, env)["requests"][0]


def _listed(env, **tags):
    return ok(SIMULATED, "listMachines", {"tags": {"provisionerd:cluster": "c1", **tags}}, env)["machines"]


def _refused(answer, code):
    assert answer.rc == 1, answer
    error = answer.doc["error"]
    assert error["code"] == code, error
    assert error["retryable"] is (code in ("capacity_unavailable", "throttled"))
    return error


def test_prices_are_marked_simulated(env, contract):
    templates = ok(SIMULATED, "getAvailableTemplates", {}, env)
    contract.check_output("getAvailableTemplates", templates)
    prices = [t["price"] for t in templates["templates"] if "price" in t]
    assert prices and all("simulated" in p["source"] and "not a real price" in p["source"] for p in prices)


def test_boot_takes_the_configured_status_polls(env):
    write_sim_config(env, delays={"bootPolls": 2})
    request_id = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 1, "op-boot"), env)["requestId"]
    assert [m["status"] for m in _listed(env)] == ["pending"]
    first = _status(env, request_id)  # a separate process: the poll count lives in the shared state file
    assert (first["status"], first["machines"][0]["result"]) == ("running", "executing")
    second = _status(env, request_id)
    assert (second["status"], second["machines"][0]["result"]) == ("complete", "succeed")
    assert [m["status"] for m in _listed(env)] == ["running"]


def test_capacity_fault_applies_to_its_templates_only(env, contract):
    write_sim_config(env, faults=[{"kind": "capacity", "templates": ["sim-gpu-4"]}])
    answer = oneshot(SIMULATED, "requestMachines", request_input("sim-gpu-4", 1, "op-gpu"), env)
    contract.check_error(answer.doc)
    _refused(answer, "capacity_unavailable")
    ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 1, "op-cpu"), env)
    assert len(_listed(env)) == 1


def test_template_capacity_fulfils_partly_then_refuses(env):
    write_sim_config(env, delays={"bootPolls": 0})  # sim-gpu-4: maxNumber 16, capacity 4
    request_id = ok(SIMULATED, "requestMachines", request_input("sim-gpu-4", 6, "op-six"), env)["requestId"]
    status = _status(env, request_id)
    assert status["status"] == "complete_with_error" and "4 of 6" in status["message"]
    assert len(status["machines"]) == 4
    _refused(
        oneshot(SIMULATED, "requestMachines", request_input("sim-gpu-4", 1, "op-more"), env), "capacity_unavailable"
    )
    error = _refused(
        oneshot(SIMULATED, "requestMachines", request_input("sim-gpu-4", 13, "op-max"), env), "quota_exceeded"
    )
    assert "maxNumber" in error["message"]


def test_every_nth_call_faults(env):
    write_sim_config(
        env,
        faults=[
            {"kind": "quota", "every": 2},
            {"kind": "throttle", "actions": ["listMachines"], "after": 1, "times": 1},
        ],
    )
    outcomes = [
        oneshot(SIMULATED, "requestMachines", request_input("sim-cpu-8", 1, f"op-{i}"), env).rc for i in range(4)
    ]
    assert outcomes == [0, 1, 0, 1]
    _listed(env)
    _refused(oneshot(SIMULATED, "listMachines", {"tags": {"provisionerd:cluster": "c1"}}, env), "throttled")
    assert len(_listed(env)) == 2  # times: 1


def test_partial_fulfilment_creates_fewer(env):
    write_sim_config(env, delays={"bootPolls": 0}, faults=[{"kind": "partial", "count": 1}])
    request_id = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 3, "op-partial"), env)["requestId"]
    status = _status(env, request_id)
    assert status["status"] == "complete_with_error" and "1 of 3" in status["message"]
    assert len(status["machines"]) == 1 and len(_listed(env)) == 1


def test_vanished_machines_leave_the_listing(env):
    write_sim_config(env, delays={"bootPolls": 0}, faults=[{"kind": "vanish", "after": 1, "times": 1}])
    request_id = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 2, "op-v"), env)["requestId"]
    first, second = _status(env, request_id)["machines"]
    assert len(_listed(env)) == 2  # the rule's first listMachines call is skipped ("after": 1)
    assert [m["machineId"] for m in _listed(env)] == [second["machineId"]]  # the oldest vanished
    gone = _status(env, request_id)["machines"][0]
    assert (gone["result"], gone["status"]) == ("fail", "terminated")
    wanted = ok(
        SIMULATED, "getReturnRequests", {"machines": [{"name": first["name"], "machineId": first["machineId"]}]}, env
    )
    assert wanted["requests"] == [{"machine": first["name"], "machineId": first["machineId"], "gracePeriod": 0}]


def test_reclaimed_machines_are_asked_back(env, contract):
    write_sim_config(env, delays={"bootPolls": 0}, faults=[{"kind": "reclaim", "gracePeriod": 90, "times": 1}])
    request_id = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 2, "op-r"), env)["requestId"]
    first, _ = _status(env, request_id)["machines"]
    wanted = ok(SIMULATED, "getReturnRequests", {"machines": []}, env)
    contract.check_output("getReturnRequests", wanted)
    (entry,) = wanted["requests"]
    assert (entry["machineId"], entry["machine"]) == (first["machineId"], first["name"])
    assert 0 < entry["gracePeriod"] <= 90
    assert len(ok(SIMULATED, "getReturnRequests", {"machines": []}, env)["requests"]) == 1  # still wanted
    ok(SIMULATED, "requestReturnMachines", return_input([first], "op-give-back"), env)
    assert ok(SIMULATED, "getReturnRequests", {"machines": []}, env)["requests"] == []


def test_reclaims_by_tags_answer_only_the_clusters_machines(env, contract):
    """``features.reclaimsByTags``: asked by tags and naming no machine, the plugin answers the reclaimed machines
    that carry the tags, and not another cluster's."""
    assert ok(SIMULATED, "describeProvider", {}, env)["features"]["reclaimsByTags"] is True
    write_sim_config(env, delays={"bootPolls": 0}, faults=[{"kind": "reclaim", "count": 2, "times": 1}])
    mine = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 1, "op-m", cluster="c1"), env)["requestId"]
    theirs = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 1, "op-t", cluster="c2"), env)["requestId"]
    (machine,) = _status(env, mine)["machines"]
    (other,) = _status(env, theirs)["machines"]
    document = {"machines": [], "tags": {"provisionerd:cluster": "c1"}}
    contract.check_input("getReturnRequests", document)
    wanted = ok(SIMULATED, "getReturnRequests", document, env)
    contract.check_output("getReturnRequests", wanted)
    assert [e["machineId"] for e in wanted["requests"]] == [machine["machineId"]]
    everyone = ok(SIMULATED, "getReturnRequests", {"machines": []}, env)["requests"]
    assert {e["machineId"] for e in everyone} == {machine["machineId"], other["machineId"]}


def test_slow_answers_late(env):
    write_sim_config(env, faults=[{"kind": "slow", "actions": ["describeProvider"], "delaySeconds": 0.5}])
    started = time.monotonic()
    ok(SIMULATED, "describeProvider", {}, env)
    assert time.monotonic() - started >= 0.5


def test_hang_never_answers_and_holds_no_lock(env):
    write_sim_config(env, faults=[{"kind": "hang", "actions": ["listMachines"], "times": 1}])
    started = time.monotonic()
    answer = oneshot(SIMULATED, "listMachines", {"tags": {"provisionerd:cluster": "c1"}}, env, timeout=1.0)
    assert answer.rc is None and answer.stdout == b"" and time.monotonic() - started < 5
    ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 1, "op-after-hang"), env)  # lock is free


def test_crash_after_the_effect_then_the_op_id_replay_finds_it(env):
    write_sim_config(env, faults=[{"kind": "crash", "actions": ["requestMachines"], "times": 1}])
    ask = request_input("sim-cpu-8", 2, "op-crash")
    answer = oneshot(SIMULATED, "requestMachines", ask, env)
    assert answer.rc == 70
    with pytest.raises(ValueError):
        json.loads(answer.stdout)
    # What the daemon does with an unknown outcome: look for the op_id's tag, then retry with the same op_id.
    assert len(_listed(env, **{"provisionerd:op": "op-crash"})) == 2
    request_id = ok(SIMULATED, "requestMachines", ask, env)["requestId"]
    assert len(_status(env, request_id)["machines"]) == 2
    assert len(_listed(env)) == 2


def test_garbage_output(env):
    write_sim_config(env, faults=[{"kind": "garbage", "actions": ["getAvailableTemplates"]}])
    answer = oneshot(SIMULATED, "getAvailableTemplates", {}, env)
    assert answer.rc == 0 and answer.stdout
    with pytest.raises(ValueError):
        json.loads(answer.stdout)


def test_bad_input_config_and_environment_are_typed_errors(env, contract):
    _refused(
        oneshot(SIMULATED, "requestMachines", {"template": {"templateId": "sim-cpu-8", "machineCount": 0}}, env),
        "invalid_request",
    )
    missing_tags = {k: v for k, v in request_input("sim-cpu-8", 1, "op-t").items() if k != "tags"}
    _refused(oneshot(SIMULATED, "requestMachines", missing_tags, env), "invalid_request")
    short = request_input("sim-cpu-8", 2, "op-short")
    short["bootstrap"] = short["bootstrap"][:1]
    _refused(oneshot(SIMULATED, "requestMachines", short, env), "invalid_request")

    Path(env["PRO_CONF_DIR"], "simulated.json").write_text('{"templates": [{"templateId": 5}]}')
    answer = oneshot(SIMULATED, "describeProvider", {}, env)
    contract.check_error(answer.doc)
    assert "templates[0].templateId" in _refused(answer, "provider_error")["message"]
    no_data = {k: v for k, v in env.items() if k not in ("PRO_DATA_DIR", "PRO_CONF_DIR")}
    assert "PRO_DATA_DIR" in _refused(oneshot(SIMULATED, "describeProvider", {}, no_data), "provider_error")["message"]
    usage = oneshot(SIMULATED, "describeProvider", {}, env)  # still the bad config
    assert usage.rc == 1


def test_reclaims_come_in_pages(env, contract):
    write_sim_config(env, delays={"bootPolls": 0}, faults=[{"kind": "reclaim", "count": 3, "times": 1}])
    request_id = ok(SIMULATED, "requestMachines", request_input("sim-cpu-8", 4, "op-rp"), env)["requestId"]
    _status(env, request_id)
    first = ok(SIMULATED, "getReturnRequests", {"machines": [], "pageSize": 2}, env)
    contract.check_output("getReturnRequests", first)
    assert len(first["requests"]) == 2 and first["nextCursor"] == first["requests"][-1]["machineId"]
    rest = ok(SIMULATED, "getReturnRequests", {"machines": [], "pageSize": 2, "cursor": first["nextCursor"]}, env)
    assert len(rest["requests"]) == 1 and "nextCursor" not in rest
    ids = [r["machineId"] for r in first["requests"] + rest["requests"]]
    assert len(set(ids)) == 3 and ids == sorted(ids)
    refused = oneshot(SIMULATED, "getReturnRequests", {"machines": [], "pageSize": 0}, env)
    _refused(refused, "invalid_request")
