"""Pilot jobs on a real Slurm cluster: request, list, idempotency, secrecy of the token, return."""

from __future__ import annotations

import os

import pytest
from rigs import wait
from rigs.plugin import PluginClient
from rigs.scan import secret_in_processes
from rigs.slurm import SlurmTestCluster

pytestmark = pytest.mark.integration


def test_two_pilot_jobs_run_on_the_nodes_and_are_found_by_their_tags(
    plugin: PluginClient, clean_cluster: SlurmTestCluster
) -> None:
    doc = plugin.request("op-life", "node", 2)  # 2 CPUs each: one pilot per node
    first = plugin.call("requestMachines", doc)
    status = plugin.settle(first["requestId"])
    assert status["status"] == "complete", status
    machines = status["machines"]
    jobs = clean_cluster.jobs()
    assert sorted(jobs[m["machineId"]]["state"] for m in machines) == ["RUNNING", "RUNNING"]
    assert sorted(jobs[m["machineId"]]["nodes"] for m in machines) == ["n1", "n2"]
    assert {m["node"] for m in machines} == {"n1", "n2"}
    for m in machines:
        assert m["result"] == "succeed" and m["status"] == "running"
        assert m["privateIpAddress"] == "127.0.0.1" and m["launchtime"] > 0
        assert m["tags"] == {**plugin.owner("op-life"), "provisionerd:instance": m["instanceRef"]}
        assert jobs[m["machineId"]]["name"] == m["name"]

    listed = plugin.listed()
    assert set(listed) == {m["machineId"] for m in machines}
    assert all(listed[m["machineId"]]["tags"] == m["tags"] for m in machines)
    assert set(plugin.listed(**{"provisionerd:op": "op-life"})) == set(listed)
    assert plugin.listed(**{"provisionerd:op": "another-op"}) == {}
    cluster_tags = {"tags": {"provisionerd:cluster": plugin.cluster_tag}}
    first_page = plugin.call("listMachines", {**cluster_tags, "pageSize": 1})
    last_page = plugin.call("listMachines", {**cluster_tags, "pageSize": 1, "cursor": first_page["nextCursor"]})
    assert "nextCursor" not in last_page  # two pilots, two pages of one, in job id order, each once
    paged = [m["machineId"] for m in first_page["machines"] + last_page["machines"]]
    assert paged == sorted(listed, key=int)

    # The same op_id again (even from a daemon that lost its records): the same jobs, none new.
    again = plugin.call("requestMachines", doc)
    assert again["requestId"] == first["requestId"] and "2 already existed" in again["message"]
    for record in plugin.data_dir.joinpath("requests").iterdir():
        record.unlink()
    third = plugin.call("requestMachines", doc)
    assert third["requestId"] == first["requestId"]
    assert clean_cluster.jobs().keys() == jobs.keys()
    assert sorted(m["machineId"] for m in plugin.status(first["requestId"])["machines"]) == sorted(listed)

    # Return: scancel of exactly these jobs; twice is harmless; they leave squeue's live states and the listing.
    ret = plugin.give_back("op-life-ret", machines)
    assert plugin.settle(ret["requestId"])["status"] == "complete"
    assert plugin.give_back("op-life-ret", machines)["requestId"] == ret["requestId"]
    assert plugin.settle(plugin.give_back("op-life-ret2", machines)["requestId"])["status"] == "complete"
    assert not clean_cluster.live_jobs()
    shown = clean_cluster.run("squeue", "-h", "-o", "%i").stdout.split()  # the default view: live jobs
    assert not set(shown) & {m["machineId"] for m in machines}
    assert {clean_cluster.jobs()[m["machineId"]]["state"] for m in machines} == {"CANCELLED"}
    assert plugin.listed() == {}
    # Our own cancellation is not a reclaim, and the creation request now says "returned".
    refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines]
    assert plugin.call("getReturnRequests", {"machines": refs})["requests"] == []
    after = plugin.status(first["requestId"])
    assert {(m["result"], m["status"]) for m in after["machines"]} == {("succeed", "terminated")}


def test_the_join_token_is_only_in_a_0600_file_the_agent_deletes(
    plugin: PluginClient, clean_cluster: SlurmTestCluster
) -> None:
    doc = plugin.request("op-secret", "small", 2)
    request_id = plugin.call("requestMachines", doc)["requestId"]
    token_files = sorted((clean_cluster.workdir / "tokens").glob("*.token"))
    contents = {p.read_text() for p in token_files}
    assert set(plugin.tokens) <= contents  # written before the jobs start (a job may already be running)
    for path in token_files:
        if path.read_text() in plugin.tokens:
            assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(clean_cluster.workdir / "tokens").st_mode & 0o777) == "0o700"

    machines = plugin.settle(request_id)["machines"]
    # The agents read and delete their files.
    wait.blocking(
        "the agents to delete their token files",
        lambda: (
            not any(
                p.exists() and p.read_text() in plugin.tokens
                for p in (clean_cluster.workdir / "tokens").glob("*.token")
            )
        ),
        30,
        interval=0.2,
    )
    for m in machines:
        job_id = m["machineId"]
        shown = clean_cluster.run("scontrol", "show", "job", "-d", job_id).stdout
        script = clean_cluster.run("scontrol", "write", "batch_script", job_id, "-").stdout
        assert "--token-file" in script and "exec " in script
        for token in plugin.tokens:
            assert token not in shown and token not in script
        assert "Comment=provisionerd-v1 " in shown and f"JobName={m['name']}" in shown
    # Nor anywhere Slurm keeps jobs: slurmctld's state (each job's script and environment files), slurmd's spools,
    # the daemons' logs.
    stored = [p for p in clean_cluster.root.rglob("*") if p.is_file() and "tokens" not in p.parts]
    assert any(p.name == "environment" for p in stored)  # the saved job environments are among them
    for path in stored:
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # slurmctld rotated it (node_state -> node_state.old) since the listing
            continue
        assert not any(t.encode() in data for t in plugin.tokens), path
    for token in plugin.tokens:
        assert secret_in_processes(token) == []  # not in any command line or environment (ps -ef / ps e)
        assert all(token not in text for text in plugin.outputs)  # nor in anything the plugin printed
    log = "".join(p.read_text() for p in (clean_cluster.workdir / "logs").glob("*.out"))
    assert "starting instance_ref='op-secret-i0'" in log and not any(t in log for t in plugin.tokens)
    plugin.give_back("op-secret-ret", machines)
