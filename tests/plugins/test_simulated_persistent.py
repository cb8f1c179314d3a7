"""The simulated provider's persistent entry point: JSON-lines, many requests in flight, faults, shared state."""

from __future__ import annotations

import json
import time

import pytest
from plugintest_client import SIMULATED, ok, request_input, return_input, write_sim_config

pytestmark = pytest.mark.process
PROVIDER = [SIMULATED / "provider"]
CLUSTER = {"tags": {"provisionerd:cluster": "c1"}}


def test_many_requests_in_flight(env, contract, start_persistent):
    plugin = start_persistent(PROVIDER, env)
    request_id = plugin.result("requestMachines", request_input("sim-cpu-8", 3, "op-many"))["requestId"]
    calls = [
        ("describeProvider", {}),
        ("getAvailableTemplates", {}),
        ("listMachines", CLUSTER),
        ("getRequestStatus", {"requests": [{"requestId": request_id}]}),
        ("getReturnRequests", {"machines": []}),
    ]
    sent = {}
    lines = []
    for i in range(300):
        action, inp = calls[i % len(calls)]
        sent[1000 + i] = action
        lines.append(json.dumps({"id": 1000 + i, "action": action, "input": inp}))
    plugin.send_raw(("\n".join(lines) + "\n").encode())  # all in flight at once
    answers = {}
    while len(answers) < len(sent):
        line = plugin.read_line(timeout=20)
        assert line is not None, f"{len(answers)} of {len(sent)} answered"
        doc = json.loads(line)
        answers[doc["id"]] = doc
    assert answers.keys() == sent.keys()
    for rid, doc in answers.items():
        contract.check_output(sent[rid], doc["result"])
    assert plugin.close() == 0


def test_state_is_shared_with_oneshot_calls_and_survives_a_restart(env, start_persistent):
    first = start_persistent(PROVIDER, env)
    by_persistent = first.result("requestMachines", request_input("sim-cpu-8", 2, "op-p"))["requestId"]
    assert len(ok(SIMULATED, "listMachines", CLUSTER, env)["machines"]) == 2  # one-shot sees them
    assert len(first.result("listMachines", CLUSTER)["machines"]) == 2  # (this answer is now cached)
    ok(SIMULATED, "requestMachines", request_input("sim-mem-16", 1, "op-o"), env)
    assert len(first.result("listMachines", CLUSTER)["machines"]) == 3  # and the process sees the one-shot's
    assert first.close() == 0

    second = start_persistent(PROVIDER, env)
    assert len(second.result("listMachines", CLUSTER)["machines"]) == 3
    replay = second.result("requestMachines", request_input("sim-cpu-8", 2, "op-p"))
    assert replay["requestId"] == by_persistent
    assert len(second.result("listMachines", CLUSTER)["machines"]) == 3


def test_slow_answers_come_after_fast_ones(env, start_persistent):
    write_sim_config(env, faults=[{"kind": "slow", "actions": ["describeProvider"], "delaySeconds": 0.4}])
    plugin = start_persistent(PROVIDER, env)
    slow = plugin.send("describeProvider", {})
    fast = plugin.send("getAvailableTemplates", {})
    started = time.monotonic()
    assert json.loads(plugin.read_line())["id"] == fast
    assert json.loads(plugin.read_line())["id"] == slow
    assert time.monotonic() - started >= 0.3


def test_hang_drops_only_that_request(env, start_persistent):
    write_sim_config(env, faults=[{"kind": "hang", "actions": ["listMachines"], "times": 1}])
    plugin = start_persistent(PROVIDER, env)
    hung = plugin.send("listMachines", CLUSTER)
    other = plugin.call("describeProvider", {})
    assert "result" in other
    assert plugin.read_line(timeout=0.5) is None  # nothing for the hung request
    assert "result" in plugin.call("listMachines", CLUSTER)  # times: 1
    assert hung not in plugin.answers


def test_crash_exits_mid_answer(env, start_persistent):
    write_sim_config(env, faults=[{"kind": "crash", "actions": ["getAvailableTemplates"], "after": 1}])
    plugin = start_persistent(PROVIDER, env)
    assert "result" in plugin.call("getAvailableTemplates", {})
    plugin.send("getAvailableTemplates", {})
    rest = plugin.read_rest()
    assert rest and not rest.endswith(b"\n")  # half an answer, then EOF
    assert plugin.proc.wait(timeout=10) == 70


def test_garbage_line_then_normal_service(env, start_persistent):
    write_sim_config(env, faults=[{"kind": "garbage", "actions": ["describeProvider"], "times": 1}])
    plugin = start_persistent(PROVIDER, env)
    plugin.send("describeProvider", {})
    line = plugin.read_line()
    with pytest.raises(ValueError):
        json.loads(line)
    assert "result" in plugin.call("describeProvider", {})


def test_bad_lines_are_skipped_or_refused(env, start_persistent):
    plugin = start_persistent(PROVIDER, env)
    plugin.send_raw(b'not json\n{"action": "describeProvider"}\n{"id": "7", "action": "x"}\n')
    unknown = plugin.call("noSuchAction", {})
    assert unknown["error"]["code"] == "invalid_request"
    assert plugin.call("stopMachines", {})["error"]["code"] == "invalid_request"
    assert plugin.call("listMachines", {"tags": {}})["error"]["code"] == "invalid_request"
    assert plugin.close() == 0
    log = plugin.proc.stderr.read().decode()
    assert "not JSON" in log and "integer id" in log


def _fresh_env(env, tmp_path, name):
    data = tmp_path / name
    data.mkdir()
    return {**env, "PRO_DATA_DIR": str(data)}


def test_ids_are_deterministic_from_the_seed(env, tmp_path, start_persistent):
    def run(seed, name):
        e = _fresh_env(env, tmp_path, name)
        write_sim_config(e, seed=seed)
        plugin = start_persistent(PROVIDER, e)
        first = plugin.result("requestMachines", request_input("sim-cpu-8", 2, "op-a"))["requestId"]
        second = plugin.result("requestMachines", request_input("sim-mem-16", 1, "op-b"))["requestId"]
        status = plugin.result("getRequestStatus", {"requests": [{"requestId": first}, {"requestId": second}]})
        return [first, second, *(m["machineId"] for r in status["requests"] for m in r["machines"])]

    same_a, same_b, other = run(7, "a"), run(7, "b"), run(8, "c")
    assert same_a == same_b
    assert len(set(same_a)) == 5
    assert not set(same_a) & set(other)


def test_probability_faults_repeat_with_the_seed(env, tmp_path, start_persistent):
    faults = [{"kind": "throttle", "actions": ["describeProvider"], "probability": 0.5}]

    def pattern(name):
        e = _fresh_env(env, tmp_path, name)
        write_sim_config(e, seed=11, faults=faults)
        plugin = start_persistent(PROVIDER, e)
        return ["error" in plugin.call("describeProvider", {}) for _ in range(24)]

    first, second = pattern("a"), pattern("b")
    assert first == second
    assert 0 < sum(first) < len(first)


def test_a_bad_config_stops_the_process_with_a_message(env, start_persistent):
    write_sim_config(env, faults=[{"kind": "explode"}])
    plugin = start_persistent(PROVIDER, env)
    assert plugin.proc.wait(timeout=10) == 1
    assert b"faults[0].kind" in plugin.proc.stderr.read()


def test_world_events_are_saved_for_everyone(env, start_persistent):
    write_sim_config(env, delays={"bootPolls": 0}, faults=[{"kind": "reclaim", "gracePeriod": 60, "times": 1}])
    plugin = start_persistent(PROVIDER, env)
    plugin.result("requestMachines", request_input("sim-cpu-8", 2, "op-w"))
    (wanted,) = plugin.result("getReturnRequests", {"machines": []})["requests"]
    # The reclaim happened in the persistent process; a one-shot call (a separate process) sees it too.
    (seen,) = ok(SIMULATED, "getReturnRequests", {"machines": []}, env)["requests"]
    assert seen["machineId"] == wanted["machineId"]


def test_return_takes_the_configured_polls_whichever_request_is_polled(env, start_persistent):
    write_sim_config(env, delays={"bootPolls": 0, "returnPolls": 2})
    plugin = start_persistent(PROVIDER, env)
    request_id = plugin.result("requestMachines", request_input("sim-cpu-8", 1, "op-rp"))["requestId"]
    (machine,) = plugin.result("getRequestStatus", {"requests": [{"requestId": request_id}]})["requests"][0]["machines"]
    plugin.result("requestReturnMachines", return_input([machine], "op-ret-a"))
    second = plugin.result("requestReturnMachines", return_input([machine], "op-ret-b"))["requestId"]
    assert [m["status"] for m in plugin.result("listMachines", CLUSTER)["machines"]] == ["shutting-down"]

    def poll():
        (entry,) = plugin.result("getRequestStatus", {"requests": [{"requestId": second}]})["requests"]
        return entry["status"], entry["machines"][0]["result"], entry["machines"][0]["status"]

    assert poll() == ("running", "executing", "shutting-down")
    assert poll() == ("complete", "succeed", "terminated")
    assert plugin.result("listMachines", CLUSTER)["machines"] == []
