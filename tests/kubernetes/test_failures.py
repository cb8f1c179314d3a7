"""Unknown outcomes, quota, scheduling and permissions, against the real API server; the conformance kit."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs import plugin as plugins
from rigs import wait
from rigs.k8s import PLUGIN, ControlPlane, Namespace, persistent, secret_token
from rigs.plugin import Persistent

pytestmark = pytest.mark.integration


def test_the_conformance_kit_passes(namespace: Namespace, tmp_path: Path) -> None:
    done, summary = plugins.check(PLUGIN, tmp_path / "conf", namespace.config(), "persistent", timeout=300)
    failed = [c for c in summary["checks"] if not c["ok"]]
    assert done.returncode == 0 and not failed and summary["passed"] >= 14, (failed, done.stderr[-2000:])
    # listMachines pages (one Kubernetes limit/continue page per call), not one answer of everything.
    pages = {c["name"]: c["detail"] for c in summary["checks"]}["listMachines pages join up"]
    assert "does not page" not in pages and "pages of 1, each once" in pages, pages
    # The kit's machines were real pods, and its returns deleted them and their Secrets.
    wait.blocking("the kit's pods to be gone", lambda: not namespace.pods(), 60, interval=0.2)
    assert not [s for s in namespace.secrets() if s.startswith("pvd-")]


def test_a_plugin_killed_after_creating_a_pod_leaves_one_pod_on_retry(namespace: Namespace, tmp_path: Path) -> None:
    crashing = persistent(tmp_path / "p1", namespace.config(testFaults=["exit_after_pod_create"]), "c-retry")
    doc = crashing.request("op-r", "small", 1)
    crashing.send("requestMachines", doc)
    assert crashing.proc is not None
    assert crashing.proc.wait(timeout=60) == 70  # died before answering: the outcome is unknown to the daemon
    assert crashing.proc.stdout is not None and crashing.proc.stdout.read() == ""
    crashing.close()
    (name,) = namespace.pods()
    assert name not in namespace.secrets()  # the crash came before the Secret
    plugin = persistent(tmp_path / "p2", namespace.config(), "c-retry")
    try:
        accepted = plugin.call("requestMachines", doc)  # the daemon's retry: same op_id, same bootstrap
        assert "1 already existed" in accepted["message"]
        assert list(namespace.pods()) == [name]
        secret = namespace.secrets()[name]
        assert secret_token(secret) == doc["bootstrap"][0]["joinToken"]
        assert secret.metadata.owner_references[0].uid == namespace.pods()[name].metadata.uid
        done = plugin.settle(accepted["requestId"])
        assert done["status"] == "complete" and [m["machineId"] for m in done["machines"]] == [name]
        # Once more, answered this time: still the one pod.
        assert plugin.call("requestMachines", doc)["requestId"] == accepted["requestId"]
        assert list(namespace.pods()) == [name]
    finally:
        plugin.close()


def test_a_quota_that_fits_two_pods_gives_two_and_quota_exceeded_for_the_rest(
    plugin: Persistent, namespace: Namespace
) -> None:
    core = namespace.plane.core
    core.create_namespaced_resource_quota(
        namespace.name, {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}}}
    )
    wait.blocking(
        "the quota controller to publish the quota",
        lambda: (core.read_namespaced_resource_quota("two-pods", namespace.name).status.hard or {}).get("pods"),
        30,
        interval=0.2,
    )
    offers = plugin.call("getAvailableTemplates", {})["templates"]
    assert {t["templateId"]: t["maxNumber"] for t in offers}["small"] == 2  # the quota bounds the offer
    accepted = plugin.call("requestMachines", plugin.request("op-q", "small", 3))
    assert "2 of 3 pod(s) made" in accepted["message"] and "exceeded quota" in accepted["message"]
    done = plugin.settle(accepted["requestId"])
    assert done["status"] == "complete_with_error" and len(done["machines"]) == 2
    assert "1 of 3 asked were not made" in done["message"]
    refused = plugin.error("requestMachines", plugin.request("op-q2", "small", 1))
    assert refused["code"] == "quota_exceeded" and refused["retryable"] is False
    assert "exceeded quota" in refused["message"]
    assert len(namespace.pods()) == 2


def test_unschedulable_for_too_long_is_capacity_unavailable(namespace: Namespace, tmp_path: Path) -> None:
    plugin = persistent(tmp_path / "p", namespace.config(unschedulableSeconds=1), "c-unsched")
    try:
        accepted = plugin.call("requestMachines", plugin.request("op-u", "nowhere", 1))
        done = plugin.settle(accepted["requestId"], timeout=60)
        (machine,) = done["machines"]
        assert machine["result"] == "fail" and "capacity_unavailable" in machine["message"], machine
        wait.blocking("the unschedulable pod to be deleted", lambda: not namespace.pods(), 60, interval=0.2)
        refused = plugin.error("requestMachines", plugin.request("op-u2", "nowhere", 1))
        assert refused["code"] == "capacity_unavailable" and refused["retryable"] is True
        assert "nowhere" in refused["message"]
        # Other templates are not affected.
        plugin.call("requestMachines", plugin.request("op-u3", "small", 1))
    finally:
        plugin.close()


@pytest.mark.parametrize("drop", [("delete", "pods"), ("create", "secrets")])
def test_a_verb_missing_from_the_role_shows_in_status(
    control_plane: ControlPlane, tmp_path: Path, drop: tuple[str, str]
) -> None:
    ns = Namespace(control_plane, f"drop-{drop[0]}-{drop[1]}", tmp_path / "ns", drop=(drop,))
    plugin = persistent(tmp_path / "p", ns.config(), "c-access")
    try:
        report = plugin.call("describeProvider", {})["status"]
        assert report["connectivity"]["ok"] and report["connectivity"]["server"] == "v1.37.2"
        assert report["access"]["ok"] is False and report["access"]["code"] == "auth_failed"
        assert report["access"]["missing"] == [f"{drop[0]} {drop[1]}"]
        assert report["readiness"]["ok"] and report["capacity"]["ok"]
        if drop == ("create", "secrets"):
            refused = plugin.error("requestMachines", plugin.request("op-a", "small", 1))
            assert refused["code"] == "auth_failed" and "'create' on 'secrets'" in refused["message"]
    finally:
        plugin.close()
        ns.delete()


def test_the_full_role_passes_every_access_check(plugin: Persistent) -> None:
    report = plugin.call("describeProvider", {})["status"]
    assert all(part["ok"] for part in report.values()), report
    assert len(report["access"]["checked"]) == 9
