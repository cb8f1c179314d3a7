"""Node capacity for the status split: per template, how many more of its pods the matching nodes fit.

Read only with the OPTIONAL ClusterRole in ``rbac-nodes.yaml`` (``list nodes``, ``list pods`` cluster-wide: a
node's requests include other namespaces' pods). A node matches a template when it is schedulable, Ready, carries
every label of the template's ``nodeSelector`` and has no ``NoSchedule``/``NoExecute`` taint the template does not
tolerate. Its room is ``allocatable - requests`` of the pods bound to it that have not ended, in CPU, memory and
pod count; the template's room is the sum over matching nodes of how many of its pods fit in each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from k8s_plugin.config import Template, cpu_millis, memory_bytes

#: Bounded work on a big cluster: at most this many nodes and pods are read (the answer says when it stopped).
MAX_NODES = 5000
MAX_PODS = 100_000


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and str(tol.get("value", "")) == str(taint.get("value", "")):
            return True
    return False


def matches(node: Mapping[str, Any], template: Template) -> bool:
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    labels = meta.get("labels") or {}
    if spec.get("unschedulable"):
        return False
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return False
    if any(labels.get(k) != v for k, v in template.node_selector.items()):
        return False
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, template.tolerations):
            return False
    return True


def _quantity(parse: Any, value: Any) -> int:
    try:
        return int(parse(str(value)))
    except (ValueError, KeyError, TypeError):
        return 0


def requested(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Per node name: (cpu millis, memory bytes, pods) requested by the pods bound to it that have not ended."""
    out: dict[str, tuple[int, int, int]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        cpu = mem = 0
        for container in (pod.get("spec") or {}).get("containers") or []:
            req = (container.get("resources") or {}).get("requests") or {}
            cpu += _quantity(cpu_millis, req.get("cpu", "0"))
            mem += _quantity(memory_bytes, req.get("memory", "0"))
        c, m, n = out.get(node, (0, 0, 0))
        out[node] = (c + cpu, m + mem, n + 1)
    return out


def room(
    nodes: Iterable[Mapping[str, Any]], used: Mapping[str, tuple[int, int, int]], template: Template
) -> dict[str, int]:
    """``{"nodeRoom": n, "nodes": k}``: pods of ``template`` the ``k`` matching nodes still fit."""
    need_cpu, need_mem = cpu_millis(template.cpu), memory_bytes(template.memory)
    total = count = 0
    for node in nodes:
        if not matches(node, template):
            continue
        count += 1
        alloc = (node.get("status") or {}).get("allocatable") or {}
        c, m, n = used.get((node.get("metadata") or {}).get("name", ""), (0, 0, 0))
        fits = [
            _quantity(int, alloc.get("pods", "110")) - n,
            (_quantity(cpu_millis, alloc.get("cpu", "0")) - c) // need_cpu if need_cpu else None,
            (_quantity(memory_bytes, alloc.get("memory", "0")) - m) // need_mem if need_mem else None,
        ]
        total += max(0, min(f for f in fits if f is not None))
    return {"nodeRoom": total, "nodes": count}
