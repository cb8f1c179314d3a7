"""The whole daemon on Kubernetes: the reference controller (in this process, real TLS sockets), the real
``DaemonCore`` and the Kubernetes plugin over its persistent transport, as its ServiceAccount, against the real API
server.

Containers do not run here, so a stand-in kubelet (``rigs.k8s.StandInKubelet``) does what a kubelet would for each
of our pods kwok marks Running: it starts the pod's command as a local process with the pod's Secret where the pod
mounts it, and stops it when the pod is gone. Demand 3 gives 3 pods whose agents join; demand 0 gives
the pods and their Secrets back; a foreign pod and a foreign Secret in the namespace stay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import wait
from rigs.core import running_core
from rigs.daemon import make_certs
from rigs.facts import facts_of
from rigs.k8s import PLUGIN, Namespace, StandInKubelet, end_to_end_config

from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape, Returned
from refcontroller.api import open_refcontroller

pytestmark = pytest.mark.integration

PROVIDER = PLUGIN.provider
CLUSTER_TAG = "e2e-k8s"


def test_the_daemon_grows_onto_kubernetes_and_shrinks_back(namespace: Namespace, tmp_path: Path) -> None:
    core = namespace.plane.core
    spec = {"containers": [{"name": "c", "image": "x"}], "automountServiceAccountToken": False}
    core.create_namespaced_pod(namespace.name, {"metadata": {"name": "foreign"}, "spec": spec})
    core.create_namespaced_secret(namespace.name, {"metadata": {"name": "foreign"}, "stringData": {"k": "v"}})
    with StandInKubelet(namespace, tmp_path / "kubelet") as kubelet:
        out = trio.run(_scenario, namespace, tmp_path)
    intents = [f for f in out["facts"] if isinstance(f, RequestIntent)]
    made = out["made"]  # the instance facts once the agents had joined and been named
    assert sum(i.count for i in intents) == 3 and len(made) == 3
    assert {f.machine_id for f in made} == set(out["pods_up"]) == set(kubelet.started)
    assert {(h["instance_ref"], h["machine_id"]) for h in out["hosts"]} == {
        (f.instance_ref, f.machine_id) for f in made
    }
    assert {m for f in out["facts"] if isinstance(f, Returned) for m in f.machine_ids} == set(out["pods_up"])
    # all_facts is the whole log: the ended lifecycles left the resync set, not the log.
    assert {f.machine_id for f in out["facts"] if isinstance(f, InstanceFact)} == set(out["pods_up"])
    pods, secrets = namespace.pods(), namespace.secrets()
    assert not set(out["pods_up"]) & set(pods) and not set(out["pods_up"]) & set(secrets)
    assert "foreign" in pods and pods["foreign"].metadata.deletion_timestamp is None and "foreign" in secrets
    for token in out["tokens"]:
        assert token not in out["events"]


async def _scenario(namespace: Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    certs = make_certs(tmp, CLUSTER_TAG)
    async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.5) as ctl:
        config = end_to_end_config(tmp, namespace, certs, ctl.addresses, CLUSTER_TAG)
        async with running_core(config, ctl.addresses, {PROVIDER: 3}) as running:
            await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=1), 3)])

            async def joined() -> tuple[list[dict[str, Any]], list[InstanceFact]] | None:
                # An agent may join on its intent's token before the daemon commits its InstanceFact
                # (refcontroller/workers.py): the daemon commits the facts of a request once it is final, i.e.
                # once the plugin reports every pod Running, seen at its next poll, and the last pod's agent
                # usually joins before that. Its host has no machine id until the fact names it.
                hosts = [h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER]
                made = facts_of(ctl.server.cluster.store, InstanceFact)
                up = len(hosts) == 3 and all(h["status"] in ("joined", "idle") for h in hosts)
                named = all(h["machine_id"] for h in hosts) and len(made) == 3
                return (hosts, made) if up and named else None

            what = "three agents joined and their instance facts"
            out["hosts"], out["made"] = await wait.until(what, joined, 120, interval=0.3)
            out["pods_up"] = {f.machine_id for f in out["made"]}
            assert len(out["pods_up"]) == 3  # else the waits below for these machines would pass at once
            await ctl.set_demand([])
            returned = lambda: {m for f in facts_of(ctl.server.cluster.store, Returned) for m in f.machine_ids}  # noqa: E731
            await wait.until_sync("three machines Returned", lambda: returned() >= out["pods_up"], 90, interval=0.3)

            def gone() -> bool:
                pods, secrets = namespace.pods(), namespace.secrets()
                return not (out["pods_up"] & set(pods)) and not (out["pods_up"] & set(secrets))

            await wait.until("the pods and Secrets to be gone", lambda: trio.to_thread.run_sync(gone), 60, interval=0.3)
            out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        out["tokens"] = list(running.tokens.values())
    out["events"] = (tmp / "events.jsonl").read_text()
    return out
