"""The plugin against the real API server, as its ServiceAccount: create, status, list, return; what stays
untouched; where the join token is (and is not)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rigs import wait
from rigs.k8s import Namespace, secret_token
from rigs.plugin import Persistent

pytestmark = pytest.mark.integration


def iter_json_strings(doc: Any) -> Iterator[str]:
    """Every key and string value in a JSON document, however deep."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from iter_json_strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from iter_json_strings(v)


def test_request_status_list_return(plugin: Persistent, namespace: Namespace) -> None:
    accepted = plugin.call("requestMachines", plugin.request("op-1", "small", 2))
    done = plugin.settle(accepted["requestId"])
    assert done["status"] == "complete", done
    machines = done["machines"]
    assert [m["result"] for m in machines] == ["succeed", "succeed"]
    assert {m["instanceRef"] for m in machines} == {"op-1-i0", "op-1-i1"}
    assert all(m["tags"]["provisionerd:op"] == "op-1" and m["privateIpAddress"] for m in machines)
    pods, secrets = namespace.pods(), namespace.secrets()
    for m in machines:
        pod = pods[m["machineId"]]
        assert pod.status.phase == "Running" and pod.spec.node_name.startswith("kwok-node-")
        assert pod.metadata.labels["provisionerd/op"] == "op-1"
        # The Secret is the pod's own (ownerReferences), holds the token, and only that pod mounts it.
        secret = secrets[m["machineId"]]
        assert [(r.kind, r.uid) for r in secret.metadata.owner_references] == [("Pod", pod.metadata.uid)]
        assert secret_token(secret) in plugin.tokens
        assert [v.secret.secret_name for v in pod.spec.volumes if v.secret] == [m["machineId"]]
        # The token is nowhere in the pod (spec, env, command line, annotations).
        text = json.dumps(namespace.plane.admin.sanitize_for_serialization(pod))
        assert not any(t in text for t in plugin.tokens)
        assert pod.spec.automount_service_account_token is False
    assert set(plugin.listed()) == {m["machineId"] for m in machines}
    assert set(plugin.listed(**{"provisionerd:op": "op-1"})) == {m["machineId"] for m in machines}
    assert plugin.listed(**{"provisionerd:op": "op-other"}) == {}

    ret = plugin.give_back("ret-1", machines)
    wait.blocking(
        "the return to complete", lambda: plugin.status(ret["requestId"])["status"] == "complete", 60, interval=0.2
    )
    assert not {m["machineId"] for m in machines} & set(namespace.pods())
    assert not {m["machineId"] for m in machines} & set(namespace.secrets())
    assert plugin.listed() == {}
    again = plugin.give_back("ret-1", machines)  # returning twice is harmless
    assert again["requestId"] == ret["requestId"]
    assert not any(t in line for line in plugin.outputs for t in plugin.tokens)


def test_foreign_pods_and_secrets_are_never_touched(plugin: Persistent, namespace: Namespace) -> None:
    core = namespace.plane.core
    spec = {"containers": [{"name": "c", "image": "x"}], "automountServiceAccountToken": False}
    core.create_namespaced_pod(namespace.name, {"metadata": {"name": "foreign"}, "spec": spec})
    # Looks like ours by its labels but carries no tags annotation: still not ours.
    fake_labels = {"app.kubernetes.io/managed-by": "provisionerd", "provisionerd/cluster": plugin.cluster_tag}
    core.create_namespaced_pod(
        namespace.name, {"metadata": {"name": "pvd-lookalike-0", "labels": fake_labels}, "spec": spec}
    )
    core.create_namespaced_secret(namespace.name, {"metadata": {"name": "foreign"}, "stringData": {"k": "v"}})
    accepted = plugin.call("requestMachines", plugin.request("op-f", "small", 1))
    ours = plugin.settle(accepted["requestId"])["machines"]
    assert set(plugin.listed()) == {ours[0]["machineId"]}
    refs = [{"name": n, "machineId": n} for n in ("foreign", "pvd-lookalike-0")] + ours
    ret = plugin.give_back("ret-f", refs)
    assert "refused 2 not ours" in ret["message"]
    status = plugin.settle(ret["requestId"], timeout=60)
    by_id = {m["machineId"]: m for m in status["machines"]}
    assert by_id["foreign"]["result"] == "fail" and by_id["foreign"]["status"] == "untouched"
    assert by_id[ours[0]["machineId"]]["result"] == "succeed"
    pods = namespace.pods()
    assert "foreign" in pods and "pvd-lookalike-0" in pods and pods["foreign"].metadata.deletion_timestamp is None
    assert "foreign" in namespace.secrets()


def test_the_garbage_collector_deletes_the_secret_with_its_pod(plugin: Persistent, namespace: Namespace) -> None:
    accepted = plugin.call("requestMachines", plugin.request("op-gc", "small", 1))
    (machine,) = plugin.settle(accepted["requestId"])["machines"]
    name = machine["machineId"]
    core = namespace.plane.core
    core.delete_namespaced_pod(name, namespace.name, grace_period_seconds=0)  # someone else deletes the pod
    wait.blocking(
        "the garbage collector to delete the pod's Secret", lambda: name not in namespace.secrets(), 60, interval=0.2
    )
    # ... and the daemon hears of it as a machine taken back.
    wanted = plugin.call("getReturnRequests", {"machines": [{"name": name, "machineId": name}]})["requests"]
    assert [(w["machineId"], w["gracePeriod"]) for w in wanted] == [(name, 0)]
    try:
        core.read_namespaced_pod(name, namespace.name)
        raise AssertionError("the pod is still there")
    except ApiException as exc:
        assert exc.status == 404


def test_no_token_in_any_json_string_of_the_pods(plugin: Persistent, namespace: Namespace) -> None:
    plugin.call("requestMachines", plugin.request("op-t", "small", 2))
    for pod in namespace.pods().values():
        strings = list(iter_json_strings(namespace.plane.admin.sanitize_for_serialization(pod)))
        assert not any(t in s for s in strings for t in plugin.tokens)


def test_list_machines_pages_join_up(plugin: Persistent, namespace: Namespace) -> None:
    """One Kubernetes page (``limit``/``continue``) per call: ``nextCursor`` is the continue token, absent on the
    last page; the pages join up to the whole listing, each pod once. A cursor the API server cannot read is a
    typed ``invalid_request``."""
    accepted = plugin.call("requestMachines", plugin.request("op-p", "small", 3))
    made = {m["machineId"] for m in plugin.settle(accepted["requestId"])["machines"]}
    core = namespace.plane.core
    spec = {"containers": [{"name": "c", "image": "x"}], "automountServiceAccountToken": False}
    core.create_namespaced_pod(namespace.name, {"metadata": {"name": "foreign"}, "spec": spec})
    assert set(plugin.listed()) == made
    tags = {"provisionerd:cluster": plugin.cluster_tag}
    for size in (1, 2):
        seen: list[str] = []
        cursors: list[str] = []
        doc: dict[str, Any] = {"tags": tags, "pageSize": size}
        for _ in range(10):
            page = plugin.call("listMachines", doc)
            assert len(page["machines"]) <= size
            seen += [m["machineId"] for m in page["machines"]]
            if "nextCursor" not in page:
                break
            cursors.append(page["nextCursor"])
            doc = {"tags": tags, "pageSize": size, "cursor": page["nextCursor"]}
        else:
            raise AssertionError(f"no last page after 10 pages: {cursors}")
        assert sorted(seen) == sorted(made), (size, seen)
        # It pages: at least one cursor per full page before the last (the API server may end with an empty
        # page), never the same cursor twice.
        assert len(cursors) >= -(-len(made) // size) - 1 and len(set(cursors)) == len(cursors), (size, cursors)
    bad = plugin.error("listMachines", {"tags": tags, "pageSize": 1, "cursor": "not-a-continue-token"})
    assert bad["code"] == "invalid_request", bad
