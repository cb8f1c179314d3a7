"""providers/local with real agent processes: request, idempotency, listing by tags, return, restarts, deaths."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from agent_procs import alive, cmdline, environ, ignores, parent
from local_driver import (
    CLUSTER,
    PLUGIN,
    OneShot,
    Persistent,
    PluginFailed,
    local_conf,
    plugin_env,
    request_input,
    return_input,
)
from rigs import procs, wait
from rigs.agents import live_agents

pytestmark = pytest.mark.process

#: Nothing listens there: these agents keep retrying, which is all a provider test needs of them.
NOWHERE = ["127.0.0.1:9"]


def tokens(n: int) -> list[str]:
    return [secrets.token_urlsafe(24) for _ in range(n)]


def labels(pid: int) -> dict[str, str]:
    argv = cmdline(pid)
    return dict(v.split("=", 1) for k, v in pairwise(argv) if k == "--label")


def agents_by_machine(tmp_path: Path) -> dict[str, int]:
    """The agent of each machine. A child an agent forked and has not exec'd yet (trio's ``ldconfig -p`` at import)
    shows the agent's command line: a process whose parent is a live agent is not one."""
    found = {}
    pids = live_agents(str(tmp_path))
    for pid in pids:
        try:
            argv = cmdline(pid)
            if parent(pid) in pids:
                continue
        except OSError:
            continue  # exited since live_agents looked
        if "--machine-id" in argv:  # read again: the pid may be gone, or reused by a process that is no agent
            found[argv[argv.index("--machine-id") + 1]] = pid
    return found


def settle(plugin: OneShot | Persistent, request_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        [entry] = plugin.call("getRequestStatus", {"requests": [{"requestId": request_id}]})["requests"]
        return entry if entry["status"] != "running" else None

    return wait.blocking(f"request {request_id} to settle", done, 60, 0.1)


def listed(plugin: OneShot | Persistent, **tags: str) -> dict[str, dict[str, Any]]:
    out = plugin.call("listMachines", {"tags": {"provisionerd:cluster": CLUSTER, **tags}})
    return {m["machineId"]: m for m in out["machines"]}


def test_lifecycle_with_real_agents(certs: Path, tmp_path: Path) -> None:
    plugin = OneShot(plugin_env(tmp_path, local_conf(certs)), tmp_path)
    secret = tokens(2)
    ask = request_input("op-1", secret, NOWHERE)
    first = plugin.call("requestMachines", ask)
    entry = settle(plugin, first["requestId"])
    assert entry["status"] == "complete", entry
    machines = {m["machineId"]: m for m in entry["machines"]}
    assert len(machines) == 2 and all(m["result"] == "succeed" for m in machines.values())

    running = agents_by_machine(tmp_path)
    assert set(running) == set(machines)
    for machine_id, pid in running.items():
        instance_ref = machines[machine_id]["instanceRef"]
        assert labels(pid) == {
            "provisionerd:cluster": CLUSTER,
            "provisionerd:provider": "local",
            "provisionerd:op": "op-1",
            "provisionerd:epoch": "1.1",
            "provisionerd:instance": instance_ref,
            "provisionerd-local:data-dir": str((tmp_path / "data").resolve()),
        }
        assert machines[machine_id]["tags"]["provisionerd:instance"] == instance_ref
        argv, env = "\0".join(cmdline(pid)), environ(pid)
        assert not any(token in argv or token.encode() in env for token in secret)

    again = plugin.call("requestMachines", ask)  # the same op_id: the same agents, none new
    assert again["requestId"] == first["requestId"]
    assert agents_by_machine(tmp_path) == running

    assert set(listed(plugin)) == set(machines)
    first = plugin.call("listMachines", {"tags": {"provisionerd:cluster": CLUSTER}, "pageSize": 1})
    rest = plugin.call(
        "listMachines", {"tags": {"provisionerd:cluster": CLUSTER}, "pageSize": 1, "cursor": first["nextCursor"]}
    )
    assert "nextCursor" not in rest  # two machines, two pages of one, joined: each once
    assert sorted(m["machineId"] for m in first["machines"] + rest["machines"]) == sorted(machines)
    assert set(listed(plugin, **{"provisionerd:op": "op-1"})) == set(machines)
    assert listed(plugin, **{"provisionerd:op": "op-other"}) == {}
    other = plugin.call("listMachines", {"tags": {"provisionerd:cluster": "someone-else"}})
    assert other["machines"] == []

    returned = plugin.call("requestReturnMachines", return_input("ret-1", list(machines)))
    wait.blocking("the agents to exit", lambda: not agents_by_machine(tmp_path), 60, 0.05)
    done = settle(plugin, returned["requestId"])
    assert done["status"] == "complete"
    assert {m["result"] for m in done["machines"]} == {"succeed"}
    assert {m["status"] for m in done["machines"]} == {"terminated"}
    assert listed(plugin) == {}

    # Returning twice is harmless, with the same op_id or a new one.
    assert (
        plugin.call("requestReturnMachines", return_input("ret-1", list(machines)))["requestId"]
        == returned["requestId"]
    )
    fresh = plugin.call("requestReturnMachines", return_input("ret-2", list(machines)))
    assert settle(plugin, fresh["requestId"])["status"] == "complete"

    # No token anywhere: not in an answer, not in the plugin's state or the agents' logs.
    everything = "".join(plugin.outputs)
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            everything += path.read_text(errors="replace")
    assert not any(token in everything for token in secret)


def test_listing_survives_a_plugin_restart(certs: Path, tmp_path: Path) -> None:
    env = plugin_env(tmp_path, local_conf(certs))
    plugin = Persistent(env)
    try:
        first = plugin.call("requestMachines", request_input("op-r", tokens(2), NOWHERE))
        machines = {m["machineId"] for m in settle(plugin, first["requestId"])["machines"]}
    finally:
        plugin.close()
    pids = agents_by_machine(tmp_path)
    assert set(pids) == machines  # the agents outlived the plugin: they run in their own sessions

    # Another provider instance (another data dir) does not see them; a restarted one does, by their tags.
    stranger = Persistent(plugin_env(tmp_path, local_conf(certs), data="other-data"))
    try:
        assert listed(stranger) == {}
    finally:
        stranger.close()
    plugin = Persistent(env)
    try:
        found = listed(plugin, **{"provisionerd:op": "op-r"})
        assert set(found) == machines
        assert all(m["tags"]["provisionerd:op"] == "op-r" and m["status"] == "running" for m in found.values())
        assert settle(plugin, first["requestId"])["status"] == "complete"
        plugin.call("requestReturnMachines", return_input("ret-r", sorted(machines)))
        wait.blocking("the agents to exit", lambda: not agents_by_machine(tmp_path), 60, 0.05)
    finally:
        plugin.close()


def test_an_agent_that_died_is_reported_and_a_reused_pid_is_not_touched(certs: Path, tmp_path: Path) -> None:
    plugin = OneShot(plugin_env(tmp_path, local_conf(certs)), tmp_path)
    request = plugin.call("requestMachines", request_input("op-d", tokens(2), NOWHERE))
    machines = sorted(m["machineId"] for m in settle(plugin, request["requestId"])["machines"])
    victim, survivor = machines
    pids = agents_by_machine(tmp_path)
    os.kill(pids[victim], signal.SIGKILL)
    wait.blocking("the killed agent to die", lambda: not alive(pids[victim]), 60, 0.05)

    wanted = plugin.call("getReturnRequests", {"machines": [{"name": m, "machineId": m} for m in machines]})
    assert wanted["requests"] == [{"machine": victim, "machineId": victim, "gracePeriod": 0}]
    assert plugin.call("getReturnRequests", {"machines": []})["requests"] == wanted["requests"]
    asked = [{"name": m, "machineId": m} for m in [*machines, "local-gone"]]  # and one that no longer exists
    page = plugin.call("getReturnRequests", {"machines": asked, "pageSize": 1})
    last = plugin.call("getReturnRequests", {"machines": asked, "pageSize": 1, "cursor": page["nextCursor"]})
    assert "nextCursor" not in last
    assert sorted(r["machineId"] for r in page["requests"] + last["requests"]) == sorted([victim, "local-gone"])
    status = {m["machineId"]: m for m in settle(plugin, request["requestId"])["machines"]}
    assert status[victim]["result"] == "fail" and status[survivor]["result"] == "succeed"
    assert set(listed(plugin)) == {survivor}

    # The dead agent's pid now belongs to an unrelated process: returning the machine must not signal it.
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as bystander:
        try:
            record_path = tmp_path / "data" / "machines" / f"{victim}.json"
            record = json.loads(record_path.read_text())
            with open(f"/proc/{bystander.pid}/stat") as handle:
                text = handle.read()
            record.update(pid=bystander.pid, starttime=int(text[text.rfind(")") + 2 :].split()[19]))
            record_path.write_text(json.dumps(record))
            plugin.call("requestReturnMachines", return_input("ret-d", [victim]))
            assert plugin.call("getReturnRequests", {"machines": []})["requests"] == []
            assert bystander.poll() is None
        finally:
            bystander.kill()
    plugin.call("requestReturnMachines", return_input("ret-s", [survivor]))
    wait.blocking("the survivor to exit", lambda: not agents_by_machine(tmp_path), 60, 0.05)


def test_typed_refusals(certs: Path, tmp_path: Path) -> None:
    templates = [{"templateId": "tiny", "maxNumber": 1, "ncpus": 1, "memMb": 512, "price": None}]
    plugin = OneShot(plugin_env(tmp_path, local_conf(certs, templates=templates)), tmp_path)
    described = plugin.call("describeProvider", {})
    assert described["features"]["priceQuotes"] is False and described["features"]["idempotentRequest"]
    [template] = plugin.call("getAvailableTemplates", {})["templates"]
    assert template["maxNumber"] == 1 and template["attributes"]["ncpus"] == ["Numeric", "1"]
    assert "price" not in template
    with pytest.raises(PluginFailed) as refused:
        plugin.call("requestMachines", request_input("op-q", tokens(2), NOWHERE, template="tiny"))
    assert refused.value.code == "quota_exceeded"
    with pytest.raises(PluginFailed) as refused:
        plugin.call("requestMachines", request_input("op-x", tokens(1), NOWHERE, template="nope"))
    assert refused.value.code == "invalid_request"
    plugin.call("requestMachines", request_input("op-1", tokens(1), NOWHERE, template="tiny"))
    assert plugin.call("getAvailableTemplates", {})["templates"][0]["maxNumber"] == 0
    other_ask = request_input("op-1", tokens(1), NOWHERE, template="tiny")
    other_ask["bootstrap"][0]["instanceRef"] = "another-instance"
    with pytest.raises(PluginFailed) as refused:  # the same op_id for another ask
        plugin.call("requestMachines", other_ask)
    assert refused.value.code == "invalid_request"
    [machine_id] = agents_by_machine(tmp_path)
    foreign = plugin.call("requestReturnMachines", return_input("ret-f", [machine_id], cluster="foreign"))
    [entry] = settle(plugin, foreign["requestId"])["machines"]
    assert entry["result"] == "fail" and agents_by_machine(tmp_path)
    plugin.call("requestReturnMachines", return_input("ret-1", [machine_id]))
    wait.blocking("the agent to exit", lambda: not agents_by_machine(tmp_path), 60, 0.05)


def test_unknown_requests_and_bad_config_are_typed(tmp_path: Path) -> None:
    plugin = OneShot(plugin_env(tmp_path, {"templates": [{"templateId": "x", "maxNumber": -1}]}), tmp_path)
    with pytest.raises(PluginFailed) as refused:
        plugin.call("getAvailableTemplates", {})
    assert refused.value.code == "provider_error" and "maxNumber" in refused.value.error["message"]
    plugin = OneShot(plugin_env(tmp_path, {}), tmp_path)
    [entry] = plugin.call("getRequestStatus", {"requests": [{"requestId": "req-unknown"}]})["requests"]
    assert entry == {
        "requestId": "req-unknown",
        "status": "complete_with_error",
        "message": "unknown request",
        "machines": [],
    }
    [template] = plugin.call("getAvailableTemplates", {})["templates"]  # the defaults: local-1, this host's CPUs
    assert template["templateId"] == "local-1"
    assert template["attributes"]["ncpus"] == ["Numeric", str(os.cpu_count())]
    assert template["price"]["amount"] == 0 and template["price"]["source"] == "local"


@pytest.mark.parametrize("transport", ["oneshot", "persistent"])
def test_the_conformance_kit_passes(transport: str, tmp_path: Path) -> None:
    argv = procs.provisionerd("provider", "check", "--json", "--transport", transport, PLUGIN)
    done = procs.run(argv, timeout=300, env={"TMPDIR": str(tmp_path)})
    summary = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 0 and summary["failed"] == 0, summary


STUBBORN_AGENT = """
import signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an agent that will not stop when asked
sys.stdin.read()
while True:
    signal.pause()
"""


def test_an_agent_that_ignores_sigterm_gets_sigkill_after_the_grace(certs: Path, tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_AGENT)
    plugin = OneShot(
        plugin_env(
            tmp_path, local_conf(certs, killGraceSeconds=3, agentCommand=[sys.executable, str(script), "agent"])
        ),
        tmp_path,
    )
    request = plugin.call("requestMachines", request_input("op-k", tokens(1), NOWHERE))
    [machine_id] = [m["machineId"] for m in settle(plugin, request["requestId"])["machines"]]
    pid = agents_by_machine(tmp_path)[machine_id]
    wait.blocking("the stubborn agent to ignore SIGTERM", lambda: ignores(pid, signal.SIGTERM), 60, 0.05)
    returned = plugin.call("requestReturnMachines", return_input("ret-k", [machine_id]))
    [entry] = plugin.call("getRequestStatus", {"requests": [{"requestId": returned["requestId"]}]})["requests"]
    assert entry["status"] == "running" and entry["machines"][0]["status"] == "shutting-down"
    done = settle(plugin, returned["requestId"])  # each poll sweeps: past the grace, SIGKILL
    assert done["status"] == "complete" and not alive(pid)
