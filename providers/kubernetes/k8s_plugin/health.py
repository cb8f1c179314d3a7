"""The status split (docs/kubernetes.md): four separate answers, so one failing never hides the others.

- ``connectivity``: the API server answers (``/version``), with its version.
- ``access``: one SelfSubjectAccessReview per (verb, resource) the plugin uses (``Api.VERBS``, the same list as
  ``rbac.yaml``); ``missing`` names each one the credentials lack.
- ``readiness``: this provider's pods by phase, and how many are Running with the ``Ready`` condition (an agent
  joining the controller is the daemon's to report).
- ``capacity``: per template, how many more pods the namespace's ResourceQuotas admit (``null``: no quota
  limits it), and, with the OPTIONAL ClusterRole of ``rbac-nodes.yaml`` (``list nodes``, ``list pods``
  cluster-wide), how many the matching nodes still fit (``k8s_plugin.nodes``). Without it ``nodes`` says the
  capacity is from quota only and names the missing permission.

Each part catches its own typed error and reports it as ``{"ok": false, "code", "message"}``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from k8s_plugin import labels as lab
from k8s_plugin import nodes as nodemod
from provisionerd.plugin_sdk.errors import PluginError

if TYPE_CHECKING:
    from k8s_plugin.plugin import Plugin


def _part(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"ok": True, **fn()}
    except PluginError as err:
        return {"ok": False, "code": err.code, "message": err.message}


def status_report(plugin: Plugin) -> dict[str, Any]:
    api = plugin.api

    def connectivity() -> dict[str, Any]:
        version = api.server_version()
        return {"server": str(version.get("gitVersion", ""))}

    def access() -> dict[str, Any]:
        missing = []
        for verb, resource in api.VERBS:
            allowed, _reason = api.can_i(verb, resource)
            if not allowed:
                missing.append(f"{verb} {resource}")
        if missing:
            raise PluginError(
                "auth_failed",
                f"namespace {api.namespace!r}: the credentials lack " + ", ".join(missing),
            )
        return {"checked": [f"{v} {r}" for v, r in api.VERBS]}

    def readiness() -> dict[str, Any]:
        wanted = {lab.CLUSTER: os.environ["PROVISIONERD_CLUSTER"]} if os.environ.get("PROVISIONERD_CLUSTER") else {}
        if os.environ.get("PROVIDER_NAME"):
            wanted[lab.PROVIDER] = os.environ["PROVIDER_NAME"]
        phases: Counter[str] = Counter()
        ready = 0
        for pod, _tags in plugin._owned(wanted):
            status = pod.get("status") or {}
            phases[status.get("phase") or "Pending"] += 1
            conditions = status.get("conditions") or []
            ready += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return {"pods": sum(phases.values()), "phases": dict(sorted(phases.items())), "ready": ready}

    def capacity() -> dict[str, Any]:
        templates: dict[str, dict[str, Any]] = {}
        for template in plugin.config.templates.values():
            room, lines = plugin.quota_room(template)
            templates[template.template_id] = {"quotaRoom": room, "quotas": lines}
        return {"templates": templates, "nodes": node_capacity(templates)}

    def node_capacity(templates: dict[str, dict[str, Any]]) -> dict[str, Any]:
        missing = [f"{v} {r}" for v, r in api.NODE_VERBS if not api.can_i(v, r, cluster_wide=True)[0]]
        if missing:
            return {
                "read": False,
                "source": "quota only",
                "missing": [f"{m} (cluster-wide)" for m in missing],
                "message": "capacity is from quota only: the optional ClusterRole of rbac-nodes.yaml is not bound "
                "(the credentials lack " + ", ".join(f"{m} cluster-wide" for m in missing) + ")",
            }
        node_list = (api.list_nodes(nodemod.MAX_NODES).get("items")) or []
        pods = api.list_bound_pods(nodemod.MAX_PODS)
        used = nodemod.requested(pods.get("items") or [])
        truncated = bool((pods.get("metadata") or {}).get("continue"))
        for template in plugin.config.templates.values():
            templates[template.template_id].update(nodemod.room(node_list, used, template))
        out: dict[str, Any] = {"read": True, "source": "quota and nodes", "nodes": len(node_list)}
        if truncated:
            out["message"] = f"more than {nodemod.MAX_PODS} bound pods: requests counted for the first only"
        return out

    report = {
        "connectivity": _part(connectivity),
        "access": _part(access),
        "readiness": _part(readiness),
        "capacity": _part(capacity),
    }
    if not report["access"]["ok"]:
        report["access"]["missing"] = report["access"]["message"].rsplit("lack ", 1)[-1].split(", ")
    return report
