"""The orphan dry-run on Kubernetes: a pod carrying this cluster's and provider's owner labels and tags annotation,
as the plugin makes them but with an op_id no fact names, is reported ``tagged_unknown`` by
``provisionerd orphans --dry-run --json`` (a real subprocess, mutual TLS to the reference controller, the plugin as
its ServiceAccount against the real API server), and nothing is deleted, patched or committed. A look-alike pod
(our labels, no tags annotation), another cluster's pod and a foreign pod are not in the report at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import make_certs
from rigs.k8s import PLUGIN, ROOT, Namespace, end_to_end_config

from refcontroller.api import open_refcontroller

pytestmark = pytest.mark.integration

PROVIDER = PLUGIN.provider
CLUSTER_TAG = "e2e-k8s"

SPEC = {"containers": [{"name": "c", "image": "x"}], "automountServiceAccountToken": False}


def owned_pod(name: str, tags: dict[str, str], annotate: bool = True) -> dict[str, Any]:
    """A pod labelled as the plugin labels its pods (``k8s_plugin.labels``), made directly through the API."""
    labels = {
        "app.kubernetes.io/managed-by": "provisionerd",
        "provisionerd/cluster": tags["provisionerd:cluster"],
        "provisionerd/provider": tags["provisionerd:provider"],
        "provisionerd/op": tags["provisionerd:op"],
        "provisionerd/epoch": tags["provisionerd:epoch"],
        "provisionerd/template": "small",
    }
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if annotate:
        meta["annotations"] = {"provisionerd/tags": json.dumps(dict(sorted(tags.items())), separators=(",", ":"))}
    return {"metadata": meta, "spec": SPEC}


def stray_tags(op_id: str, cluster: str = CLUSTER_TAG) -> dict[str, str]:
    return {
        "provisionerd:cluster": cluster,
        "provisionerd:provider": PROVIDER,
        "provisionerd:op": op_id,
        "provisionerd:epoch": "1.1",
    }


def snapshot(namespace: Namespace) -> dict[str, tuple[Any, ...]]:
    """What a return or a patch of ours would change (uid, labels, annotations, deletion); the scheduler and kwok
    still write a pod's binding and status, so its resourceVersion is not compared."""
    return {
        name: (
            pod.metadata.uid,
            dict(pod.metadata.labels or {}),
            dict(pod.metadata.annotations or {}),
            pod.metadata.deletion_timestamp,
        )
        for name, pod in namespace.pods().items()
    }


def test_the_orphan_dry_run_finds_a_labelled_pod_with_no_fact(namespace: Namespace, tmp_path: Path) -> None:
    core = namespace.plane.core
    core.create_namespaced_pod(namespace.name, owned_pod("pvd-stray-0", stray_tags("op-stray")))
    core.create_namespaced_pod(namespace.name, owned_pod("pvd-lookalike-0", stray_tags("op-look"), annotate=False))
    core.create_namespaced_pod(namespace.name, owned_pod("pvd-other-0", stray_tags("op-o", cluster="other")))
    core.create_namespaced_pod(namespace.name, {"metadata": {"name": "foreign"}, "spec": SPEC})
    running = lambda: all(p.status.phase == "Running" for p in namespace.pods().values())  # noqa: E731
    wait.blocking("the four pods to run (kwok)", running, 60, interval=0.2)
    seen = trio.run(_dry_run, namespace, tmp_path)
    result = seen["result"]
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["mutations"] == 0
    got = {(f["class"], f["provider"], f["machine_id"], f["action"]) for f in report["findings"]}
    assert got == {("tagged_unknown", PROVIDER, "pvd-stray-0", "report")}, report
    (finding,) = report["findings"]
    assert finding["evidence"]["tags"]["provisionerd:op"] == "op-stray"
    assert {"no_lease", "dry_run"} <= set(finding["blocked_by"])
    text = result.stdout
    assert "pvd-lookalike-0" not in text and "pvd-other-0" not in text and "foreign" not in text
    # Nothing changed: every pod as it was (same uid, labels and annotations: not patched, not deleting), the
    # controller's log, no lease taken.
    assert seen["pods_after"] == seen["pods_before"]
    assert set(seen["pods_after"]) == {"pvd-stray-0", "pvd-lookalike-0", "pvd-other-0", "foreign"}
    assert all(deleting is None for *_, deleting in seen["pods_after"].values())
    assert seen["facts_after"] == seen["facts_before"] and seen["leases"] == []


async def _dry_run(namespace: Namespace, tmp: Path) -> dict[str, Any]:
    certs = make_certs(tmp, CLUSTER_TAG)
    async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.5) as ctl:
        end_to_end_config(tmp, namespace, certs, ctl.addresses, CLUSTER_TAG)  # tmp / "pd.toml"
        assert ctl.server is not None
        cluster = ctl.server.cluster
        pods_before = await trio.to_thread.run_sync(snapshot, namespace)
        facts_before = [c.index for c in cluster.store.all_facts()]
        argv = procs.provisionerd("orphans", "--config", tmp / "pd.toml", "--dry-run", "--json")
        result = await trio.to_thread.run_sync(lambda: procs.run(argv, cwd=ROOT))
        return {
            "result": result,
            "pods_before": pods_before,
            "pods_after": await trio.to_thread.run_sync(snapshot, namespace),
            "facts_before": facts_before,
            "facts_after": [c.index for c in cluster.store.all_facts()],
            "leases": cluster.leases.live_leases(trio.current_time()),
        }
