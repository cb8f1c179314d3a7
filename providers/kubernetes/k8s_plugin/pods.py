"""The pod and Secret one machine is made of, and how a pod's state reads as a contract result.

The pod runs the worker agent (``restartPolicy: Never``: a pilot that ends is over). Its join token is in a Secret
of the same name that only this pod mounts (mode 0400), owned by the pod (``ownerReferences``: the garbage
collector deletes it with the pod; the plugin deletes it too on return). The token is never in the pod spec, its
env or its command line: the container reads it from the mounted file on standard input (``--token-stdin``).
The pod gets no ServiceAccount token (``automountServiceAccountToken: false``): the agent needs no API access. Its
certificates are in the image at ``agent.certs``, or in a site-made Secret (``agent.certsSecret``) mounted there.

The template's probes (this config's, never a request's) are agent arguments, one ``--probe=NAME=COMMAND`` each:
the entry's ``"$@"`` passes them on as they are, and only the agent's ``/bin/sh -c`` runs them. Kubernetes itself
rewrites a container's command before that (``$(VAR)`` becomes the variable's value, ``$$`` becomes ``$``), so
their ``$`` are written ``$$`` (:func:`literal`) and the agent gets each command character for character.

A pod ends itself (docs/operations.md, "What ends a machine when nothing controls it"): the bootstrap's
``maxLifetime`` (the daemon's ``max_ttl``) is its ``activeDeadlineSeconds``, so the kubelet ends it then, and its
``orphanTimeout`` (the daemon's ``worker_orphan_timeout``) is the agent's ``--orphan-timeout``, so the agent exits,
ending the pod, once no controller has been heard for that long.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from k8s_plugin import labels as lab
from k8s_plugin.config import Config, Template

TOKEN_DIR = "/var/run/provisionerd/join"
TOKEN_KEY = "token"
#: The least ``--orphan-timeout`` a pod's agent gets: the agent's own floor (its default ``--reply-timeout``).
ORPHAN_TIMEOUT_FLOOR = 15.0
#: The container's entry: the shell reads the token file onto the agent's stdin ("$@" is the agent command).
ENTRY = ["/bin/sh", "-c", f'exec "$@" --token-stdin < {TOKEN_DIR}/{TOKEN_KEY}', "provisionerd-pilot"]


def literal(text: str) -> str:
    """``text`` as a container command entry that Kubernetes' variable expansion turns back into ``text``: every
    ``$`` doubled (``$$`` is its escape for one ``$``; ``$(VAR)`` would otherwise become VAR's value, e.g.
    ``$(POD_NAME)``, and a ``$$`` the shell's own would lose a ``$``)."""
    return text.replace("$", "$$")


def probe_args(template: Template) -> list[str]:
    """The agent arguments of ``template``'s probes, as container command entries: one ``--probe=NAME=COMMAND``
    each (one argument, so a name or command that starts with ``-`` stays a value), and ``--reprobe-interval``."""
    args = [literal(f"--probe={name}={command}") for name, command in sorted(template.probes.items())]
    if template.reprobe_interval is not None:
        args += ["--reprobe-interval", f"{template.reprobe_interval:g}"]
    return args


def pod_manifest(
    config: Config, template: Template, name: str, tags: Mapping[str, str], boot: Mapping[str, Any]
) -> dict[str, Any]:
    agent = [
        *config.agent_command,
        "--certs",
        config.agent_certs,
        "--controllers",
        ",".join(boot["controllers"]),
        "--instance-ref",
        boot["instanceRef"],
        "--machine-id",
        "$(POD_NAME)",
        *config.agent_extra_args,
    ]
    if boot.get("orphanTimeout"):
        # The pod ending is the machine's return (restartPolicy Never): exiting is all the agent has to do.
        agent += ["--orphan-timeout", f"{max(float(boot['orphanTimeout']), ORPHAN_TIMEOUT_FLOOR):g}"]
    agent += probe_args(template)
    resources = {"cpu": template.cpu, "memory": template.memory}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [
            {
                "name": "agent",
                "image": template.image,
                "command": [*ENTRY, *agent],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "resources": {"requests": resources, "limits": resources},
                "volumeMounts": [{"name": "join", "mountPath": TOKEN_DIR, "readOnly": True}],
            }
        ],
        "volumes": [{"name": "join", "secret": {"secretName": name, "defaultMode": 0o400}}],
    }
    if config.agent_certs_secret:
        # The worker's certificates from the site's Secret, not baked into the image (0400, like the token).
        spec["volumes"].append(
            {"name": "certs", "secret": {"secretName": config.agent_certs_secret, "defaultMode": 0o400}}
        )
        spec["containers"][0]["volumeMounts"].append(
            {"name": "certs", "mountPath": config.agent_certs, "readOnly": True}
        )
    if boot.get("maxLifetime"):
        # The kubelet ends the pod then, busy or not, even if nothing controls it any more (a Slurm pilot's --time).
        spec["activeDeadlineSeconds"] = max(1, math.ceil(float(boot["maxLifetime"])))
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        spec["tolerations"] = [dict(t) for t in template.tolerations]
    if config.service_account_name:
        spec["serviceAccountName"] = config.service_account_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**lab.labels_for(tags), lab.TEMPLATE_LABEL: template.template_id},
            "annotations": {lab.TAGS_ANNOTATION: lab.annotation_for(tags)},
        },
        "spec": spec,
    }


def secret_manifest(pod: Mapping[str, Any], tags: Mapping[str, str], token: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": meta["name"],
            "labels": lab.labels_for(tags),
            "annotations": {lab.TAGS_ANNOTATION: lab.annotation_for(tags)},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def owned_by(secret: Mapping[str, Any], pod_name: str) -> bool:
    refs = secret.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("kind") == "Pod" and r.get("name") == pod_name for r in refs)


def epoch_seconds(stamp: Any) -> int:
    if not isinstance(stamp, str):
        return 0
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def unschedulable_since(pod: Mapping[str, Any]) -> float | None:
    """When the scheduler first said it cannot place the pod (``PodScheduled=False, Unschedulable``), or None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return float(epoch_seconds(cond.get("lastTransitionTime")) or time.time())
    return None


def returned(pod: Mapping[str, Any]) -> bool:
    return lab.RETURNED_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


def outcome(pod: Mapping[str, Any] | None, unschedulable_limit: float, now: float) -> tuple[str, str, str]:
    """``(result, status, message)`` of one machine of a create request."""
    if pod is None:
        return "fail", "terminated", "the pod is gone (deleted outside provisionerd, or never created)"
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    name = meta.get("name", "")
    if meta.get("deletionTimestamp"):
        if returned(pod):
            return "succeed", "terminated", f"pod {name} is being deleted (returned)"
        return "fail", "terminated", f"pod {name} is being deleted outside provisionerd"
    if phase == "Running":
        return "succeed", "running", f"pod {name} is running on node {pod.get('spec', {}).get('nodeName', '')}"
    if phase == "Pending":
        since = unschedulable_since(pod)
        if since is not None and now - since > unschedulable_limit:
            return "fail", "unschedulable", f"pod {name} unschedulable for {now - since:.0f} s: capacity_unavailable"
        if since is not None:
            return "executing", "pending", f"pod {name} waits for a node (unschedulable so far)"
        return "executing", "pending", f"pod {name} is pending"
    if phase == "Succeeded" and returned(pod):
        return "succeed", "terminated", f"pod {name} ended (returned)"
    return "fail", phase.lower(), f"pod {name} ended: phase {phase}, {status.get('reason') or 'no reason given'}"
