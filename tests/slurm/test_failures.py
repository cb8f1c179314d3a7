"""What goes wrong on a real cluster, typed: reclaims, failing pilots, impossible templates, slurmctld down, time
limits, and jobs that are not ours."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from rigs import wait
from rigs.plugin import OneShot, PluginClient
from rigs.slurm import PLUGIN, SlurmTestCluster, persistent, plugin_config

pytestmark = pytest.mark.integration


def _running(plugin: PluginClient, op_id: str, template: str = "small", count: int = 1) -> list[dict]:
    request_id = plugin.call("requestMachines", plugin.request(op_id, template, count))["requestId"]
    status = plugin.settle(request_id)
    assert status["status"] == "complete", status
    return status["machines"]


def test_a_job_cancelled_by_someone_else_is_reported_as_reclaimed(
    plugin: PluginClient, clean_cluster: SlurmTestCluster
) -> None:
    [mine, other] = _running(plugin, "op-reclaim", count=2)
    refs = [{"name": m["name"], "machineId": m["machineId"]} for m in (mine, other)]
    assert plugin.call("getReturnRequests", {"machines": refs})["requests"] == []
    clean_cluster.run("scancel", mine["machineId"])  # an operator, not provisionerd
    wait.blocking("the cancel", lambda: clean_cluster.jobs()[mine["machineId"]]["state"] == "CANCELLED", interval=0.2)
    wanted = plugin.call("getReturnRequests", {"machines": refs})["requests"]
    assert [(w["machineId"], w["machine"], w["reason"], w["gracePeriod"]) for w in wanted] == [
        (mine["machineId"], mine["name"], "cancelled", 0)
    ]
    by_id = {m["machineId"]: m for m in plugin.status("slurm-req@" + _hash(plugin) + "@op-reclaim")["machines"]}
    assert by_id[mine["machineId"]]["result"] == "fail"
    assert by_id[mine["machineId"]]["message"].startswith("cancelled: ")
    assert by_id[other["machineId"]]["result"] == "succeed"
    assert set(plugin.listed()) == {other["machineId"]}


def _hash(plugin: PluginClient) -> str:
    import hashlib

    return hashlib.sha256(plugin.cluster_tag.encode()).hexdigest()[:8]


def test_a_pilot_that_exits_nonzero_fails_with_its_exit_code(clean_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    config = plugin_config(clean_cluster)
    config["agent"]["extraArgs"] = ["--heartbeat", "-1"]  # the agent refuses this and exits 2 (EXIT_USAGE)
    client = persistent(tmp_path, config, "t-nonzero")
    try:
        request_id = client.call("requestMachines", client.request("op-bad", "small", 1))["requestId"]
        # Briefly RUNNING (then "succeed": the machine came up) until the agent exits.
        status = wait.blocking(
            "the pilot to fail",
            lambda: (s := client.status(request_id))["machines"][0]["result"] == "fail" and s,
            interval=0.2,
        )
        [machine] = status["machines"]
        assert status["status"] == "complete_with_error"
        assert (machine["result"], machine["status"]) == ("fail", "terminated")
        # Read while the job is still COMPLETING or once it is FAILED: typed "failed" either way.
        assert machine["slurmState"] in ("COMPLETING", "FAILED")
        assert machine["message"] == f"failed: job {machine['machineId']}: the pilot job failed, exit code 2"
        # The token file the agent never read is removed.
        assert not [p for p in (clean_cluster.workdir / "tokens").glob("*.token") if p.read_text() in client.tokens]
        refs = [{"name": machine["name"], "machineId": machine["machineId"]}]
        [wanted] = client.call("getReturnRequests", {"machines": refs})["requests"]
        assert wanted["reason"] == "failed"
    finally:
        client.close()


def test_a_template_larger_than_any_node_is_an_invalid_request(
    plugin: PluginClient, clean_cluster: SlurmTestCluster
) -> None:
    # 3 CPUs: more than a node has (2), less than the partition (4): sbatch itself refuses it.
    error = plugin.error("requestMachines", plugin.request("op-wide", "wide", 1))
    assert error["code"] == "invalid_request" and error["retryable"] is False
    assert "Requested node configuration is not available" in error["message"]
    # 64 CPUs: more than the whole partition: Slurm accepts it to pend forever (PartitionConfig); the plugin
    # cancels it at once and refuses the request the same way.
    error = plugin.error("requestMachines", plugin.request("op-huge", "huge", 1))
    assert error["code"] == "invalid_request" and error["retryable"] is False
    assert "can never run template 'huge'" in error["message"] and "PartitionConfig" in error["message"]
    assert not clean_cluster.live_jobs() and plugin.listed() == {}
    [huge] = [j for j, info in clean_cluster.jobs().items() if "provisionerd:op=op-huge" in info["comment"]]
    assert clean_cluster.jobs()[huge]["state"] == "CANCELLED"
    refs = [{"name": "x", "machineId": huge}]
    assert plugin.call("getReturnRequests", {"machines": refs})["requests"] == []  # our cancel is no reclaim
    assert not [p for p in (clean_cluster.workdir / "tokens").glob("*.token") if p.read_text() in plugin.tokens]
    # An unknown template and a count above maxNumber are refused before Slurm is asked.
    assert plugin.error("requestMachines", plugin.request("op-x", "nope", 1))["code"] == "invalid_request"
    assert "maxNumber is 1" in plugin.error("requestMachines", plugin.request("op-y", "short", 2))["message"]


def test_slurmctld_down_is_a_retryable_error_never_an_empty_listing(
    plugin: PluginClient, clean_cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    [machine] = _running(plugin, "op-down")
    request_id = "slurm-req@" + _hash(plugin) + "@op-down"
    refs = [{"name": machine["name"], "machineId": machine["machineId"]}]
    oneshot = OneShot(PLUGIN, tmp_path / "oneshot", plugin_config(clean_cluster), plugin.cluster_tag)
    pid = clean_cluster.ctld_pid()
    # Stopped cleanly (it saves its state). After a SIGKILL it recovers from an older state save, and a job that
    # started since may then be killed as unknown: real, but not what this test is about.
    os.kill(pid, signal.SIGTERM)
    try:
        wait.blocking("slurmctld to stop", lambda: not os.path.exists(f"/proc/{pid}"), interval=0.2)
        # At once: each waits out the Slurm client's ~4 s of connection retries. The last two run with a 1 s
        # commandTimeout, the other way an unreachable controller shows (a command that hangs).
        impatient = OneShot(
            PLUGIN, tmp_path / "impatient", {**plugin_config(clean_cluster), "commandTimeout": 1}, plugin.cluster_tag
        )
        calls = {
            "listMachines": oneshot.start("listMachines", {"tags": {"provisionerd:cluster": plugin.cluster_tag}}),
            "getRequestStatus": oneshot.start("getRequestStatus", {"requests": [{"requestId": request_id}]}),
            "requestMachines": oneshot.start("requestMachines", oneshot.request("op-down-2", "small", 1)),
            "getReturnRequests": impatient.start("getReturnRequests", {"machines": refs}),
            "requestReturnMachines": impatient.start(
                "requestReturnMachines", {"machines": refs, "op_id": "r-down", "tags": oneshot.owner("r-down")}
            ),
        }
        for action, proc in calls.items():
            ok, error = oneshot.finish(proc)
            assert not ok, (action, error)
            assert (error["code"], error["retryable"]) == ("throttled", True), (action, error)
            expected = (
                "did not finish within 1 s"
                if action.endswith("Returns") or "Return" in action
                else "Unable to contact slurm controller"
            )
            assert expected in error["message"], (action, error)
    finally:
        clean_cluster.up()  # restarts slurmctld from its saved state
    assert set(plugin.listed()) == {machine["machineId"]}  # the job survived the restart and is still ours
    assert (settled := plugin.settle(request_id))["status"] == "complete", settled


def test_a_pilot_near_its_time_limit_is_announced_with_the_time_left(
    plugin: PluginClient, clean_cluster: SlurmTestCluster
) -> None:
    [machine] = _running(plugin, "op-short", template="short")  # 2 minutes; notice is 300 s by default
    [wanted] = plugin.call(
        "getReturnRequests", {"machines": [{"name": machine["name"], "machineId": machine["machineId"]}]}
    )["requests"]
    assert wanted["reason"] == "time_limit" and 60 <= wanted["gracePeriod"] <= 120


def test_jobs_without_our_tags_are_never_listed_nor_cancelled(
    plugin: PluginClient, clean_cluster: SlurmTestCluster
) -> None:
    script = "#!/bin/sh\nsleep 300\n"
    plain = clean_cluster.run(
        "sbatch", "--parsable", "-c", "1", "--mem=50", "-o", "/dev/null", input=script
    ).stdout.strip()
    foreign = "provisionerd-v1 provisionerd:cluster=someone-else provisionerd:provider=slurm"
    other = clean_cluster.run(
        "sbatch", "--parsable", "-c", "1", "--mem=50", "-o", "/dev/null", f"--comment={foreign}", input=script
    ).stdout.strip()
    wait.blocking(
        "the two foreign jobs RUNNING",
        lambda: {clean_cluster.jobs()[j]["state"] for j in (plain, other)} == {"RUNNING"},
        interval=0.2,
    )
    assert plugin.listed() == {}
    refs = [{"name": "whatever", "machineId": plain}, {"name": "whatever", "machineId": other}]
    ret = plugin.call(
        "requestReturnMachines", {"machines": refs, "op_id": "r-foreign", "tags": plugin.owner("r-foreign")}
    )
    assert "refused 2 not ours" in ret["message"]
    status = plugin.status(ret["requestId"])
    assert status["status"] == "complete_with_error"
    assert {(m["result"], m["status"]) for m in status["machines"]} == {("fail", "untouched")}
    assert {clean_cluster.jobs()[j]["state"] for j in (plain, other)} == {"RUNNING"}
    assert plugin.call("getReturnRequests", {"machines": refs})["requests"] == []
