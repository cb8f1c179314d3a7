"""The whole daemon on Slurm: the reference controller (in this process, real TLS sockets), the real ``DaemonCore``
(session, leases, gate, executor, reconcile loop) and the Slurm plugin over its persistent transport.

Demand for 2 machines makes the daemon request two pilot jobs; they run on n1 and n2, and the worker agents inside
them join the controller with the tokens the daemon minted (delivered by the plugin's 0600 files). Demand dropping
to 0 makes the daemon return the idle machines: the jobs are cancelled, the agents end, and no job of ours is left.
Nothing here plays the daemon or the machines: the test only sets demand and watches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import wait
from rigs.core import END_TO_END_TIMEOUTS, RunningCore, end_to_end_config, running_core
from rigs.daemon import make_certs
from rigs.facts import facts_of
from rigs.scan import processes_mentioning, secret_in_processes
from rigs.slurm import PLUGIN, SlurmTestCluster, plugin_config

from provisionerd.config.loader import Config
from provisionerd.domain.model import (
    DemandItem,
    InstanceFact,
    Lost,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
)
from refcontroller.api import open_refcontroller

pytestmark = pytest.mark.integration

PROVIDER = PLUGIN.provider
CLUSTER_TAG = "e2e-daemon"  # our owner tag: the jobs of this test are the ones whose comment carries it
TAG = f"provisionerd:cluster={CLUSTER_TAG}"


def write_config(tmp: Path, cluster: SlurmTestCluster, certs: Path, addresses: tuple[str, ...]) -> Config:
    # One template that fills a node (2 CPUs), so the two pilots land one per node.
    templates = [{"templateId": "node", "maxNumber": 2, "cpus": 2, "memMB": 400}]
    plugin = plugin_config(cluster, templates=templates)
    plugin["agent"] = dict(plugin["agent"], certs=str(certs))  # the nodes share this host's file system
    provider = PLUGIN.provider_config(tmp, plugin, max_machines=2, timeouts=END_TO_END_TIMEOUTS)
    return end_to_end_config(tmp, certs, addresses, provider, cluster=CLUSTER_TAG, identity="prov-slurm-e2e")


def our_jobs(cluster: SlurmTestCluster, live: bool = True) -> dict[str, dict[str, str]]:
    """This test's jobs by their owner tag (``live``: not ended)."""
    return cluster.tagged_jobs(TAG, live)


async def in_thread(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


def test_the_daemon_grows_onto_slurm_and_shrinks_back(clean_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    out = trio.run(_scenario, clean_cluster, tmp_path)
    cluster = clean_cluster

    intents = [f for f in out["facts"] if isinstance(f, RequestIntent)]
    made = [f for f in out["facts"] if isinstance(f, InstanceFact)]
    assert len(intents) == 1 and intents[0].count == 2 and intents[0].template_id == "node", intents
    assert not [f for f in out["facts"] if isinstance(f, (RequestFailed, Lost))]
    # The daemon's facts name the Slurm jobs, and each machine is the one holding the token of its instance ref.
    assert {f.machine_id for f in made} == set(out["jobs_up"])
    hashes = dict(zip(intents[0].instance_refs, intents[0].token_hashes, strict=True))
    assert set(out["tokens"]) == set(hashes)
    for fact in made:
        assert fact.token_hash == hashes[fact.instance_ref]
        assert fact.token_hash == hashlib.sha256(out["tokens"][fact.instance_ref].encode()).hexdigest()
    # Two pilots RUNNING, one per node; their agents joined as those very machines.
    assert sorted(info["state"] for info in out["jobs_up"].values()) == ["RUNNING", "RUNNING"]
    assert sorted(info["nodes"] for info in out["jobs_up"].values()) == ["n1", "n2"]
    assert {(h["instance_ref"], h["machine_id"]) for h in out["hosts"]} == {
        (f.instance_ref, f.machine_id) for f in made
    }
    assert all(h["status"] in ("joined", "idle") and h["provider"] == PROVIDER for h in out["hosts"])
    # Demand 0: each machine returned once as idle (one return or one each, as they went idle), and done.
    returns = [f for f in out["facts"] if isinstance(f, ReturnIntent)]
    assert {f.reason for f in returns} == {"idle"}
    assert sorted(m for f in returns for m in f.machine_ids) == sorted(out["jobs_up"])
    assert {m for f in out["facts"] if isinstance(f, Returned) for m in f.machine_ids} == set(out["jobs_up"])
    kinds = [type(f).__name__ for f in out["facts"]]
    assert kinds.index("RequestIntent") < kinds.index("InstanceFact") < kinds.index("ReturnIntent")
    assert kinds.index("ReturnIntent") < kinds.index("Returned")
    # The jobs were cancelled (by us, so Slurm says CANCELLED), and none of ours is live any more.
    assert out["jobs_down"] == {} and {info["state"] for info in out["ended"].values()} == {"CANCELLED"}
    assert set(out["ended"]) == set(out["jobs_up"])
    assert not our_jobs(cluster)
    # Secrets: never in Slurm's view of the jobs, a process's argv or environment, the events, or the agents' logs.
    logs = ""
    for job_id in out["jobs_up"]:
        (log,) = (cluster.workdir / "logs").glob(f"pvd-*-{job_id}.out")
        logs += log.read_text()
        assert "stopping on SIGTERM" in log.read_text()  # each agent ran in its job and ended by the cancel
    assert all(out["agents_up"].values()) and not any(out["agents_down"].values())
    for job_id in out["jobs_up"]:
        assert f"JobId={job_id} " in out["scontrol"]
    for token in out["tokens"].values():
        assert token not in out["scontrol"] and token not in out["events"] and token not in logs
        assert not out["secret_hits"][token]


async def _scenario(cluster: SlurmTestCluster, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    certs = make_certs(tmp, CLUSTER_TAG)  # the certificates name the cluster: ours, not the other Slurm tests'
    async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.5) as ctl:
        config = write_config(tmp, cluster, certs, ctl.addresses)
        async with running_core(config, ctl.addresses, {PROVIDER: 2}) as running:
            await _grow_and_shrink(cluster, ctl, running, out)
        out["tokens"] = dict(running.tokens)
    out["events"] = (tmp / "events.jsonl").read_text()
    return out


async def _grow_and_shrink(cluster: SlurmTestCluster, ctl: Any, running: RunningCore, out: dict[str, Any]) -> None:
    await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])

    # Two pilot jobs with our tags, RUNNING on the Slurm nodes, and the daemon's facts for both.
    def two_running() -> dict[str, dict[str, str]] | None:
        jobs = our_jobs(cluster)
        return jobs if len(jobs) == 2 and all(i["state"] == "RUNNING" for i in jobs.values()) else None

    out["jobs_up"] = await wait.until("two RUNNING pilot jobs", lambda: in_thread(two_running), 60, interval=0.2)
    await wait.until_sync(
        "two instance facts", lambda: len(facts_of(ctl.server.cluster.store, InstanceFact)) == 2, 60, interval=0.2
    )

    # Their agents join the controller as those machines.
    async def joined() -> list[dict[str, Any]] | None:
        hosts = [h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER]
        ok = len(hosts) == 2 and all(h["status"] in ("joined", "idle") for h in hosts)
        return hosts if ok else None

    out["hosts"] = await wait.until("both agents to join", joined, 90, interval=0.3)
    show = lambda: "".join(cluster.run("scontrol", "show", "job", j).stdout for j in out["jobs_up"])  # noqa: E731
    out["scontrol"] = await in_thread(show)
    out["secret_hits"] = {t: secret_in_processes(t) for t in running.tokens.values()}
    refs = [f.instance_ref for f in facts_of(ctl.server.cluster.store, InstanceFact)]
    out["agents_up"] = {ref: processes_mentioning(ref) for ref in refs}  # the agent's argv names its instance

    # Demand drops: the idle machines are returned, the jobs cancelled, the agents gone.
    await ctl.set_demand([])
    returned = lambda: {m for f in facts_of(ctl.server.cluster.store, Returned) for m in f.machine_ids}  # noqa: E731
    await wait.until_sync("both machines Returned", lambda: returned() >= set(out["jobs_up"]), 60, interval=0.2)
    await wait.until("no live job of ours", lambda: in_thread(lambda: not our_jobs(cluster)), 30, interval=0.2)
    out["jobs_down"] = await in_thread(our_jobs, cluster)
    out["ended"] = await in_thread(lambda: our_jobs(cluster, live=False))
    await wait.until_sync(
        "the agents to exit", lambda: not any(processes_mentioning(ref) for ref in refs), 30, interval=0.2
    )
    out["agents_down"] = {ref: processes_mentioning(ref) for ref in refs}
    out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
