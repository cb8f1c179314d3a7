"""End to end inside Slurm (issue 35, item 1): a template's probe, configured in the plugin, runs in the pilot job's
agent and its value reaches the reference controller in the join's capabilities, exactly what the command prints:
the job script's shell passed the command on without evaluating it (a ``$(...)`` in single quotes is printed as it
is), and only the agent's ``/bin/sh -c`` ran it."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import wait
from rigs.plugin import Persistent
from rigs.slurm import SlurmTestCluster, persistent, plugin_config

from refcontroller.api import open_refcontroller

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from ctl_client import Provisioner  # noqa: E402 - tests/agent's minimal provisioner

#: Quotes, spaces and a ``$(...)`` that would create TRAP if any shell before the agent's evaluated it.
PROBE = "printf '%s|%s\\n' \"fake gpu\" '$(touch TRAP)'"
EXPECTED = "fake gpu|$(touch TRAP)"


@pytest.mark.integration
def test_a_templates_probe_runs_in_the_pilot_and_its_value_reaches_the_controller(
    clean_cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    template = {"templateId": "node", "maxNumber": 1, "cpus": 1, "memMB": 100, "probes": {"gputype": PROBE}}
    client = persistent(tmp_path / "plugin", plugin_config(clean_cluster, templates=[template]), "t-probe")
    seen: dict[str, Any] = {}
    try:
        trio.run(_scenario, clean_cluster, client, tmp_path, seen)
    finally:
        client.close()
    assert seen["capabilities"]["gputype"] == EXPECTED
    assert not list(clean_cluster.workdir.rglob("TRAP")) and not list(tmp_path.rglob("TRAP"))
    assert not clean_cluster.live_jobs()


async def _scenario(cluster: SlurmTestCluster, client: Persistent, tmp_path: Path, seen: dict[str, Any]) -> None:
    op_id, ref, token = "op-probe", "op-probe-i0", secrets.token_urlsafe(24)
    async with open_refcontroller(
        cluster.certs, tmp_path / "ctl", replicas=1, lease_ttl=1.5, check_interval=0.5
    ) as ctl:
        provisioner = await Provisioner.join(cluster.certs, ctl.addresses, "slurm")
        epoch = await provisioner.lease("slurm")
        await provisioner.commit_intent("slurm", epoch, op_id, [ref], [token])
        doc = client.request(op_id, "node", 1, controllers=(ctl.addresses[0],), tokens=[token])
        request_id = (await trio.to_thread.run_sync(client.call, "requestMachines", doc))["requestId"]
        status = await trio.to_thread.run_sync(client.settle, request_id)
        assert status["status"] == "complete", status

        async def reported() -> dict[str, str] | None:
            hosts = {h["instance_ref"]: h for h in (await ctl.status())["hosts"]}
            host = hosts.get(ref)
            return dict(host["capabilities"]) if host and host.get("capabilities") else None

        # A Python agent starting on a loaded 2-core machine: 60 s.
        seen["capabilities"] = await wait.until("the pilot's agent to join with its probe", reported, 60, 0.3)
        ret = await trio.to_thread.run_sync(client.give_back, "op-probe-ret", status["machines"])
        done = await trio.to_thread.run_sync(client.settle, ret["requestId"])
        assert done["status"] == "complete"
        await provisioner.aclose()
