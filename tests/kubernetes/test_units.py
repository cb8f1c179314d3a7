"""Pure parts of the Kubernetes plugin: error mapping, labels, the Role manifest against the verbs used."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

PLUGIN = Path(__file__).resolve().parents[2] / "providers" / "kubernetes"
sys.path.insert(0, str(PLUGIN))

from k8s_plugin import labels as lab  # noqa: E402
from k8s_plugin.api import Api, ApiError, classify  # noqa: E402


def _exc(status: int, message: str = "", reason: str = "", headers: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "reason": reason, "message": message})
    exc.headers = headers or {}
    return exc


def test_errors_are_typed() -> None:
    quota = classify(
        _exc(403, 'pods "p" is forbidden: exceeded quota: q, requested: pods=1', "Forbidden"), "create", "pods", "ns"
    )
    assert quota.code == "quota_exceeded" and "exceeded quota" in quota.message
    denied = classify(_exc(403, "forbidden", "Forbidden"), "delete", "pods", "ns")
    assert denied.code == "auth_failed" and "'delete' on 'pods'" in denied.message
    assert classify(_exc(401), "list", "pods", "ns").code == "auth_failed"
    slow = classify(_exc(429, reason="TooManyRequests", headers={"Retry-After": "7"}), "list", "pods", "ns")
    assert slow.code == "throttled" and slow.retry_after == 7 and slow.document()["retryAfter"] == 7
    assert "retry after 7 s" in slow.message
    down = classify(_exc(503, reason="ServiceUnavailable"), "create", "pods", "ns")
    assert down.code == "throttled" and down.retryable
    gone = classify(_exc(404, reason="NotFound"), "get", "pods", "ns")
    assert isinstance(gone, ApiError) and gone.status == 404
    assert classify(_exc(422, "bad", "Invalid"), "create", "pods", "ns").code == "invalid_request"


def test_the_role_grants_exactly_the_verbs_the_plugin_uses() -> None:
    docs = list(yaml.safe_load_all((PLUGIN / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    granted = {(verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == set(Api.VERBS)
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_optional_cluster_role_grants_exactly_the_node_reads() -> None:
    role, binding = yaml.safe_load_all((PLUGIN / "rbac-nodes.yaml").read_text())
    assert role["kind"] == "ClusterRole" and binding["kind"] == "ClusterRoleBinding"
    granted = {(verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == set(Api.NODE_VERBS) and all(verb == "list" for verb, _ in granted)  # read-only
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [("ServiceAccount", "provisionerd")]


@pytest.mark.parametrize("value", ["c1", "op-7f3a9e.0001", "a:b", "x" * 64, "h.abc", "", "-x", "ünïcode"])
def test_label_values_are_valid_and_one_to_one(value: str) -> None:
    import re

    label = lab.label_value(value)
    assert re.fullmatch(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?", label) and len(label) <= 63
    assert (label == value) == (not label.startswith("h.") or False) or label.startswith("h.")
    others = {lab.label_value(v) for v in ["c1", "op-7f3a9e.0001", "a:b", "x" * 64, "h.abc", "", "-x", "ünïcode"]}
    assert len(others) == 8


def test_tags_of_refuses_what_is_not_ours() -> None:
    tags = {lab.CLUSTER: "c:1", lab.PROVIDER: "k8s", lab.OP: "op:1", lab.EPOCH: "3.7", lab.INSTANCE: "c/i-1"}
    meta = {"labels": lab.labels_for(tags), "annotations": {lab.TAGS_ANNOTATION: lab.annotation_for(tags)}}
    assert lab.tags_of(meta) == tags
    forged = {**meta, "labels": {**meta["labels"], "provisionerd/op": "other"}}
    assert lab.tags_of(forged) is None  # labels that disagree with the annotation
    assert lab.tags_of({"labels": meta["labels"]}) is None
    assert lab.tags_of({"labels": meta["labels"], "annotations": {lab.TAGS_ANNOTATION: "not json"}}) is None
    assert lab.pod_name("c", "op", 0) == lab.pod_name("c", "op", 0) != lab.pod_name("c", "op", 1)


def test_a_pod_ends_itself_at_max_lifetime_and_its_agent_after_the_orphan_timeout() -> None:
    """Issue 34, item 5: ``maxLifetime`` (the daemon's ``max_ttl``) is the pod's ``activeDeadlineSeconds`` (rounded
    up), ``orphanTimeout`` the agent's ``--orphan-timeout`` (at least 15 s); neither when the bootstrap has none."""
    from k8s_plugin.config import Config
    from k8s_plugin.pods import pod_manifest

    config = Config.from_document(json.loads((PLUGIN / "conf.example" / "kubernetes.json").read_text()), PLUGIN)
    template = config.templates["pilot-4c"]
    boot = {"instanceRef": "c1/i-1", "controllers": ["ctl:7443"], "joinToken": "never-in-the-spec"}
    plain = pod_manifest(config, template, "p-1", {}, boot)
    assert "activeDeadlineSeconds" not in plain["spec"]
    assert "--orphan-timeout" not in plain["spec"]["containers"][0]["command"]
    bounded = pod_manifest(config, template, "p-1", {}, {**boot, "maxLifetime": 7200.5, "orphanTimeout": 3600})
    assert bounded["spec"]["activeDeadlineSeconds"] == 7201
    command = bounded["spec"]["containers"][0]["command"]
    assert command[command.index("--orphan-timeout") + 1] == "3600"
    short = pod_manifest(config, template, "p-1", {}, {**boot, "orphanTimeout": 1})
    command = short["spec"]["containers"][0]["command"]
    assert command[command.index("--orphan-timeout") + 1] == "15"
    assert "never-in-the-spec" not in json.dumps([plain, bounded, short])


def test_the_certificates_secret_is_mounted_read_only_at_agent_certs() -> None:
    """Issue 34 item 6: a site that uses the shipped agent image gives the worker certificates as a Secret
    (``agent.certsSecret``), mounted 0400 at ``agent.certs``; without one the pod mounts only its token."""
    from k8s_plugin.config import Config
    from k8s_plugin.pods import pod_manifest

    document = json.loads((PLUGIN / "conf.example" / "kubernetes.json").read_text())
    config = Config.from_document(document, PLUGIN)
    template = config.templates["pilot-4c"]
    boot = {"instanceRef": "c1/i-1", "controllers": ["ctl:7443"]}
    assert [v["name"] for v in pod_manifest(config, template, "p-1", {}, boot)["spec"]["volumes"]] == ["join"]
    document["agent"]["certsSecret"] = "provisionerd-worker-certs"
    with_secret = Config.from_document(document, PLUGIN)
    spec = pod_manifest(with_secret, template, "p-1", {}, boot)["spec"]
    assert {"name": "certs", "secret": {"secretName": "provisionerd-worker-certs", "defaultMode": 0o400}} in spec[
        "volumes"
    ]
    mount = spec["containers"][0]["volumeMounts"][-1]
    assert mount == {"name": "certs", "mountPath": config.agent_certs, "readOnly": True}
    document["agent"]["certsSecret"] = "Not_A_Secret_Name"
    with pytest.raises(Exception, match="certsSecret|does not match"):
        Config.from_document(document, PLUGIN)
