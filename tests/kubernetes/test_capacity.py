"""Node capacity in the status split: without the optional ClusterRole (``rbac-nodes.yaml``) the status says the
capacity is from quota only and names the missing permissions; with it, per template, how many more pods the
matching nodes fit (allocatable minus requests), checked against the administrator's own reading of the nodes."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from rigs import wait
from rigs.k8s import PLUGIN, Namespace
from rigs.plugin import Persistent

pytestmark = pytest.mark.integration

RBAC_NODES = PLUGIN.path / "rbac-nodes.yaml"
GI, MI = 1 << 30, 1 << 20


def bind_node_reader(namespace: Namespace) -> str:
    """rbac-nodes.yaml as an operator applies it, for this namespace's ServiceAccount; the binding's name."""
    docs = list(yaml.safe_load_all(RBAC_NODES.read_text()))
    role, binding = docs
    role["metadata"]["name"] = binding["roleRef"]["name"] = f"pvd-nodes-{namespace.name}"
    binding["metadata"]["name"] = f"pvd-nodes-{namespace.name}"
    binding["subjects"][0]["namespace"] = namespace.name
    namespace.plane.rbac.create_cluster_role(role)
    namespace.plane.rbac.create_cluster_role_binding(binding)
    return str(binding["metadata"]["name"])


def expected_small_room(namespace: Namespace) -> int:
    """The "small" template (500m, 256Mi, no selector) on the kwok nodes, from the administrator's reading."""
    core = namespace.plane.core
    used: dict[str, list[int]] = {}
    for pod in core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items:
        if pod.status.phase in ("Succeeded", "Failed"):
            continue
        cpu = mem = 0
        for c in pod.spec.containers:
            req = (c.resources and c.resources.requests) or {}
            cpu += int(float(req.get("cpu", "0").rstrip("m")) * (1 if req.get("cpu", "").endswith("m") else 1000))
            mem += int(req.get("memory", "0Mi").rstrip("Mi")) * MI if req.get("memory") else 0
        u = used.setdefault(pod.spec.node_name, [0, 0, 0])
        u[0], u[1], u[2] = u[0] + cpu, u[1] + mem, u[2] + 1
    total = 0
    for node in core.list_node().items:
        c, m, n = used.get(node.metadata.name, [0, 0, 0])
        alloc = node.status.allocatable
        cpu_alloc = int(alloc["cpu"]) * 1000
        mem_alloc = int(alloc["memory"].rstrip("Gi")) * GI if alloc["memory"].endswith("Gi") else None
        assert mem_alloc is not None, alloc
        total += max(0, min(int(alloc["pods"]) - n, (cpu_alloc - c) // 500, (mem_alloc - m) // (256 * MI)))
    return total


def capacity(plugin: Persistent) -> dict[str, Any]:
    report = plugin.call("describeProvider", {})["status"]["capacity"]
    assert report["ok"], report
    return dict(report)


def test_node_capacity_needs_the_optional_cluster_role(plugin: Persistent, namespace: Namespace) -> None:
    without = capacity(plugin)
    assert without["nodes"]["read"] is False and without["nodes"]["source"] == "quota only"
    assert without["nodes"]["missing"] == ["list nodes (cluster-wide)", "list pods (cluster-wide)"]
    assert "quota only" in without["nodes"]["message"] and "rbac-nodes.yaml" in without["nodes"]["message"]
    assert "nodeRoom" not in without["templates"]["small"]

    name = bind_node_reader(namespace)
    try:
        with_role = wait.blocking(
            "the ClusterRole to apply", lambda: (c := capacity(plugin))["nodes"]["read"] and c, 30, interval=0.2
        )
        assert with_role["nodes"]["source"] == "quota and nodes" and with_role["nodes"]["nodes"] == 3
        assert with_role["templates"]["nowhere"]["nodeRoom"] == 0  # its nodeSelector matches no node
        assert with_role["templates"]["nowhere"]["nodes"] == 0 and with_role["templates"]["small"]["nodes"] == 3
        # One pod of ours (500m) lowers the room as the administrator reads it (retried: other namespaces'
        # pods may still be ending).
        accepted = plugin.call("requestMachines", plugin.request("op-cap", "small", 1))
        plugin.settle(accepted["requestId"])
        wait.blocking(
            "the node room to match the administrator's reading",
            lambda: capacity(plugin)["templates"]["small"]["nodeRoom"] == expected_small_room(namespace),
            30,
            interval=0.2,
        )
    finally:
        namespace.plane.rbac.delete_cluster_role_binding(name)
        namespace.plane.rbac.delete_cluster_role(name)
