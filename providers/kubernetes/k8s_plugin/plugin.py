"""The plugin object: configuration, API access, records, and one method that answers any action.

Inputs are checked against the contract's own schemas (``provisionerd.provider.schemas``) before the API is
touched: the daemon checks them too, but a plugin must not trust its caller with ``delete``.

Machines: a machine is a pod; its ``machineId`` and ``name`` are the pod's name (unique in the namespace; a delete
carries the uid read just before as a precondition, so a pod made again under the same name is never hit by an
old return).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from k8s_plugin import labels as lab
from k8s_plugin import pods as podmod
from k8s_plugin.api import Api, ApiError
from k8s_plugin.config import Config, Template, cpu_millis, memory_bytes
from k8s_plugin.health import status_report
from k8s_plugin.store import Store
from provisionerd.plugin_sdk.calls import dispatch
from provisionerd.plugin_sdk.documents import (
    describe,
    request_status,
    result_counts,
    return_status,
    unknown_request,
)
from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.ids import make_request_id, parse_request_id
from provisionerd.plugin_sdk.inputs import asked_template
from provisionerd.provider.schemas import contract

NAME = "kubernetes"
VERSION = "0.1.0"
ASKED_ANNOTATION = "provisionerd/asked"
#: Pods per list call, and at most this many pages for one answer without a page size (bounded work).
PAGE = 500
MAX_PAGES = 200


def request_id_for(kind: str, cluster: str, op_id: str) -> str:
    """``k8s-req@<cluster hash>@<op_id>`` (``plugin_sdk.ids``)."""
    return make_request_id("k8s", kind, lab.cluster_hash(cluster), op_id)


class Plugin:
    def __init__(self, config: Config, store: Store, api: Api | None = None) -> None:
        self.config = config
        self.store = store
        self.api = api or Api(config)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._actions: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
            "describeProvider": lambda doc: self.describe(),
            "getAvailableTemplates": lambda doc: self.templates(),
            "requestMachines": self.request_machines,
            "getRequestStatus": self.request_status,
            "requestReturnMachines": self.request_return,
            "getReturnRequests": self.return_requests,
            "listMachines": self.list_machines,
        }

    @classmethod
    def from_environment(cls) -> Plugin:
        return cls(Config.from_environment(), Store.from_environment())

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        """The action's result document; raises ``PluginError``."""
        return dispatch(self._actions, action, doc, contract().input_problems)

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # describeProvider, getAvailableTemplates ------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            **describe(NAME, VERSION),
            "namespace": self.config.namespace,  # ext
            "status": status_report(self),  # ext: access, connectivity, readiness, capacity (docs/kubernetes.md)
        }

    def quota_room(self, template: Template) -> tuple[int | None, list[str]]:
        """How many more pods of ``template`` the namespace's ResourceQuotas admit (None: no quota limits them),
        and one line per limiting quota."""
        room: int | None = None
        lines = []
        need = {"pods": 1, "cpu": cpu_millis(template.cpu), "memory": memory_bytes(template.memory)}
        for quota in self.api.list_quotas().get("items") or []:
            status = quota.get("status") or {}
            hard, used = status.get("hard") or {}, status.get("used") or {}
            for key, kind in (
                ("pods", "pods"),
                ("count/pods", "pods"),
                ("requests.cpu", "cpu"),
                ("limits.cpu", "cpu"),
                ("cpu", "cpu"),
                ("requests.memory", "memory"),
                ("limits.memory", "memory"),
                ("memory", "memory"),
            ):
                if key not in hard:
                    continue
                parse = {"pods": int, "cpu": cpu_millis, "memory": memory_bytes}[kind]
                try:
                    free = parse(str(hard[key])) - parse(str(used.get(key, "0")))
                except (ValueError, KeyError):
                    continue
                fits = max(0, free // need[kind]) if need[kind] else None
                if fits is not None:
                    room = fits if room is None else min(room, fits)
                    lines.append(f"{quota['metadata']['name']}: {key} {used.get(key, '0')}/{hard[key]}")
        return room, lines

    def templates(self) -> dict[str, Any]:
        out = []
        for template in self.config.templates.values():
            room, _ = self.quota_room(template)
            max_number = template.max_number if room is None else min(template.max_number, room)
            out.append(template.as_contract(max_number))
        return {"templates": out}

    # requestMachines -----------------------------------------------------------------------------------------

    def request_machines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        template, count = asked_template(self.config.templates, doc)
        owner = {k: doc["tags"][k] for k in lab.OWNER_KEYS}
        cluster, op_id = owner[lab.CLUSTER], doc["op_id"]
        request_id = request_id_for("req", cluster, op_id)
        with self._lock(request_id):
            made = again = 0
            for index, boot in enumerate(doc["bootstrap"]):
                if made == 0 and again == 0:
                    blocked = self.store.unschedulable(template.template_id, time.time())
                    if blocked:
                        raise PluginError("capacity_unavailable", blocked)
                tags = {**owner, lab.INSTANCE: boot["instanceRef"]}
                name = lab.pod_name(cluster, op_id, index)
                manifest = podmod.pod_manifest(self.config, template, name, tags, boot)
                manifest["metadata"]["annotations"][ASKED_ANNOTATION] = str(count)
                try:
                    pod = self.api.create_pod(manifest)
                    made += 1
                    if "exit_after_pod_create" in self.config.test_faults:
                        os._exit(70)  # tests: the pod exists, its Secret and the answer do not
                except ApiError as err:
                    if err.status != 409:
                        raise
                    pod = self._existing(name, cluster, op_id, template)
                    again += 1
                except PluginError as err:
                    if err.code != "quota_exceeded" or index == 0:
                        raise
                    # Partial fulfilment: the pods made so far stay; the status reports the shortfall.
                    return {
                        "requestId": request_id,
                        "message": f"{index} of {count} pod(s) made; the rest refused: {err.message}",
                    }
                self._ensure_secret(pod, tags, boot["joinToken"])
        message = f"{made} pod(s) created in namespace {self.config.namespace!r}"
        if again:
            message += f"; {again} already existed for op_id {op_id!r}"
        return {"requestId": request_id, "message": message}

    def _existing(self, name: str, cluster: str, op_id: str, template: Template) -> dict[str, Any]:
        """The pod a previous attempt of this op made under ``name`` (AlreadyExists); refuses one that is not."""
        pod = self.api.get_pod(name)
        tags = lab.tags_of(pod.get("metadata") or {})
        if tags is None or tags.get(lab.CLUSTER) != cluster or tags.get(lab.OP) != op_id:
            raise PluginError("provider_error", f"pod {name} exists and is not this op's pod: not touched")
        if (pod["metadata"].get("labels") or {}).get(lab.TEMPLATE_LABEL) != template.template_id:
            raise PluginError(
                "invalid_request", f"op_id {op_id!r} was already used for another template: refused (op_id reused)"
            )
        return pod

    def _ensure_secret(self, pod: Mapping[str, Any], tags: Mapping[str, str], token: str) -> None:
        """The pod's join-token Secret, owned by the pod; one left by an older pod of that name is replaced."""
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        try:
            self.api.create_secret(podmod.secret_manifest(pod, tags, token))
            return
        except ApiError as err:
            if err.status != 409:
                raise
        secret = self.api.get_secret(name)
        refs = secret.get("metadata", {}).get("ownerReferences") or []
        if any(r.get("uid") == uid for r in refs):
            return  # made by the first attempt of this op
        if lab.tags_of(secret.get("metadata") or {}) is None or not podmod.owned_by(secret, name):
            raise PluginError("provider_error", f"Secret {name} exists and is not ours: not touched")
        self.api.delete_secret(name, secret["metadata"]["uid"])
        self.api.create_secret(podmod.secret_manifest(pod, tags, token))

    # getRequestStatus ----------------------------------------------------------------------------------------

    def pages(self, selector: str) -> Iterator[dict[str, Any]]:
        """Every pod matching ``selector``, a page of ``PAGE`` at a time (at most ``MAX_PAGES`` pages)."""
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = self.api.list_pods(selector, PAGE, token)
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return
        raise PluginError("provider_error", f"more than {PAGE * MAX_PAGES} pods match {selector!r}")

    def _owned(self, wanted: Mapping[str, str]) -> list[tuple[dict[str, Any], dict[str, str]]]:
        out = []
        for pod in self.pages(lab.selector(wanted)):
            tags = lab.tags_of(pod.get("metadata") or {})
            if tags is not None and lab.matches(tags, wanted):
                out.append((pod, tags))
        return out

    def request_status(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        out = []
        for item in doc["requests"]:
            request_id = item["requestId"]
            parsed = parse_request_id("k8s", request_id)
            if parsed is None:
                out.append(_unknown(request_id, "not an id this plugin made"))
            elif parsed[0] == "req":
                out.append(self._creation_status(request_id, parsed[1], parsed[2]))
            else:
                out.append(self._return_status(request_id))
        return {"requests": out}

    def _creation_status(self, request_id: str, chash: str, op_id: str) -> dict[str, Any]:
        found = [
            (pod, tags) for pod, tags in self._owned({lab.OP: op_id}) if lab.cluster_hash(tags[lab.CLUSTER]) == chash
        ]
        if not found:
            return _unknown(request_id, "no pod carries its op tag")
        now = time.time()
        machines, asked = [], 0
        for pod, tags in sorted(found, key=lambda pt: pt[0]["metadata"]["name"]):
            meta = pod["metadata"]
            try:
                asked = max(asked, int((meta.get("annotations") or {}).get(ASKED_ANNOTATION, "0")))
            except ValueError:
                pass
            result, status, message = podmod.outcome(pod, self.config.unschedulable_seconds, now)
            if status == "unschedulable":
                self._give_up(pod, tags, message, now)
            machines.append(
                {
                    "machineId": meta["name"],
                    "name": meta["name"],
                    "result": result,
                    "status": status,
                    "privateIpAddress": (pod.get("status") or {}).get("podIP") if result == "succeed" else None,
                    "launchtime": podmod.epoch_seconds(
                        (pod.get("status") or {}).get("startTime") or meta.get("creationTimestamp")
                    ),
                    "message": message,
                    "instanceRef": tags.get(lab.INSTANCE, ""),
                    "tags": tags,
                    "node": (pod.get("spec") or {}).get("nodeName", ""),  # ext
                    "phase": (pod.get("status") or {}).get("phase", ""),  # ext
                }
            )
        short = max(0, asked - len(machines))
        counts = result_counts(machines)
        if not short:
            return request_status(request_id, machines, counts)
        # machines that were never made: the request cannot complete cleanly, though those made may still run
        entry = request_status(request_id, machines, f"{counts}; {short} of {asked} asked were not made")
        entry["message"] += " (quota_exceeded or refused)"
        if entry["status"] == "complete":
            entry["status"] = "complete_with_error"
        return entry

    def _cluster(self) -> str | None:
        return os.environ.get("PROVISIONERD_CLUSTER") or None

    def _give_up(self, pod: Mapping[str, Any], tags: Mapping[str, str], message: str, now: float) -> None:
        """A pod the scheduler could not place for ``unschedulableSeconds``: deleted (it is ours and its machine
        has failed), and its template refused as ``capacity_unavailable`` for as long again."""
        template_id = (pod["metadata"].get("labels") or {}).get(lab.TEMPLATE_LABEL, "")
        self.store.mark_unschedulable(
            template_id,
            now + self.config.unschedulable_seconds,
            f"template {template_id!r}: {message}",
        )
        self._delete(pod, "unschedulable")

    def _delete(self, pod: Mapping[str, Any], return_op: str) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        self.store.mark_returned(name)
        if lab.RETURNED_LABEL not in (meta.get("labels") or {}):
            patch = {"metadata": {"labels": {lab.RETURNED_LABEL: lab.label_value(return_op)}}}
            try:
                self.api.patch_pod(name, patch)
            except ApiError as err:
                if err.status != 404:
                    raise
                return
        try:
            self.api.delete_pod(name, meta["uid"])
        except ApiError as err:
            if err.status not in (404, 409):  # gone, or another pod now has the name (precondition failed)
                raise
        self._delete_secret(name, meta["uid"])

    def _delete_secret(self, name: str, pod_uid: str) -> None:
        try:
            secret = self.api.get_secret(name)
        except ApiError as err:
            if err.status == 404:
                return
            raise
        refs = (secret.get("metadata") or {}).get("ownerReferences") or []
        if lab.tags_of(secret.get("metadata") or {}) is None or not any(r.get("uid") == pod_uid for r in refs):
            return  # not this pod's Secret: never touched
        try:
            self.api.delete_secret(name, secret["metadata"]["uid"])
        except ApiError as err:
            if err.status not in (404, 409):
                raise

    def _return_status(self, request_id: str) -> dict[str, Any]:
        saved = self.store.load_return(request_id)
        if saved is None:
            return _unknown(request_id, "no record of this return")
        machines = []
        for m in saved["machines"]:
            entry: dict[str, Any] = {
                "machineId": m["machineId"],
                "name": m["name"],
                "privateIpAddress": None,
                "launchtime": m.get("launchtime", 0),
            }
            if m.get("refused"):
                entry.update(result="fail", status="untouched", message=m["refused"])
            else:
                try:
                    pod = self.api.get_pod(m["machineId"])
                except ApiError as err:
                    if err.status != 404:
                        raise
                    pod = None
                if pod is not None and pod["metadata"].get("uid") == m.get("uid"):
                    entry.update(result="executing", status="terminating", message=f"pod {m['name']} is ending")
                else:
                    entry.update(result="succeed", status="terminated", message=f"pod {m['name']} is gone")
            if m.get("tags"):
                entry["tags"] = m["tags"]
                entry["instanceRef"] = m["tags"].get(lab.INSTANCE, "")
            machines.append(entry)
        return return_status(request_id, machines)

    # requestReturnMachines, getReturnRequests ------------------------------------------------------------------

    def request_return(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        owner = doc["tags"]
        request_id = request_id_for("ret", owner[lab.CLUSTER], doc["op_id"])
        with self._lock(request_id):
            entries = []
            deleted = 0
            for ref in doc["machines"]:
                name = ref["machineId"]
                entry: dict[str, Any] = {"machineId": name, "name": ref["name"]}
                try:
                    pod = self.api.get_pod(name)
                except ApiError as err:
                    if err.status != 404:
                        raise
                    pod = None  # gone already: nothing to delete
                if pod is not None:
                    tags = lab.tags_of(pod.get("metadata") or {})
                    if not (
                        tags
                        and tags.get(lab.CLUSTER) == owner[lab.CLUSTER]
                        and tags.get(lab.PROVIDER) == owner[lab.PROVIDER]
                    ):
                        entry["refused"] = f"pod {name} does not carry this cluster's and provider's tags: not touched"
                    else:
                        entry.update(
                            tags=tags,
                            uid=pod["metadata"]["uid"],
                            launchtime=podmod.epoch_seconds(pod["metadata"].get("creationTimestamp")),
                        )
                        self._delete(pod, doc["op_id"])
                        deleted += 1
                entries.append(entry)
            self.store.save_return(request_id, {"requestId": request_id, "opId": doc["op_id"], "machines": entries})
        refused = sum(1 for e in entries if "refused" in e)
        message = f"deleted {deleted} pod(s)" + (f"; refused {refused} not ours" if refused else "")
        return {"requestId": request_id, "message": message}

    def return_requests(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Of the machines asked about, the pods Kubernetes took or is taking: deleted by someone else (an
        eviction, a drain: ``gracePeriod`` = the seconds left of its deletion grace), ended by themselves, or
        gone without a return of ours (``gracePeriod`` 0). Pods without our tags are never reported."""
        cluster = self._cluster()
        wanted_tags = {lab.CLUSTER: cluster} if cluster else {}
        live = {pod["metadata"]["name"]: pod for pod, _ in self._owned(wanted_tags)}
        now = time.time()
        out = []
        for m in doc["machines"]:
            name = m["machineId"]
            pod = live.get(name)
            if pod is None:
                if self.store.is_returned(name) or not name.startswith("pvd-"):
                    continue
                reason, grace, message = "gone", 0, f"pod {name} is gone and was not returned by provisionerd"
            else:
                meta, status = pod["metadata"], pod.get("status") or {}
                if podmod.returned(pod):
                    continue
                if meta.get("deletionTimestamp"):
                    grace = max(0, podmod.epoch_seconds(meta["deletionTimestamp"]) - int(now))
                    reason, message = "deleted", f"pod {name} is being deleted outside provisionerd"
                elif status.get("phase") in ("Succeeded", "Failed"):
                    reason, grace = status["phase"].lower(), 0
                    message = f"pod {name} ended: {status.get('reason') or status['phase']}"
                else:
                    continue
            out.append(
                {"machine": m["name"], "machineId": name, "gracePeriod": grace, "reason": reason, "message": message}
            )
        return {"status": "complete", "message": f"{len(out)} pod(s) taken back by Kubernetes", "requests": out}

    # listMachines ----------------------------------------------------------------------------------------------

    def list_machines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Live pods (not deleting, not ended) carrying all the given tags, read with Kubernetes' own paging
        (``limit``/``continue``). With ``pageSize`` one page is answered and ``nextCursor`` is the continue token
        (``cursor`` passes it back); without, every page is read (at most ``PAGE * MAX_PAGES`` pods)."""
        wanted = dict(doc["tags"])
        selector = lab.selector(wanted)
        page_size = doc.get("pageSize")
        if page_size is None:
            items, next_cursor = list(self.pages(selector)), None
        else:
            try:
                page = self.api.list_pods(selector, int(page_size), doc.get("cursor") or None)
            except ApiError as err:
                if err.status == 410:
                    raise PluginError("invalid_request", "the cursor has expired: list again from the start") from None
                raise
            items = page.get("items") or []
            next_cursor = (page.get("metadata") or {}).get("continue") or None
        machines = []
        for pod in items:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            tags = lab.tags_of(meta)
            if tags is None or not lab.matches(tags, wanted) or meta.get("deletionTimestamp"):
                continue
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            machines.append(
                {
                    "machineId": meta["name"],
                    "name": meta["name"],
                    "status": (status.get("phase") or "Pending").lower(),
                    "launchtime": podmod.epoch_seconds(status.get("startTime") or meta.get("creationTimestamp")),
                    "privateIpAddress": status.get("podIP"),
                    "tags": tags,
                    "node": (pod.get("spec") or {}).get("nodeName", ""),  # ext
                }
            )
        out: dict[str, Any] = {"machines": machines}
        if page_size is not None and next_cursor:
            out["nextCursor"] = next_cursor
        return out


def _unknown(request_id: str, why: str) -> dict[str, Any]:
    return unknown_request(request_id, f"unknown request: {why}")
