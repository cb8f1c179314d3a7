"""The Kubernetes API through the official client (``kubernetes``), every call mapped to a typed error.

Calls return the server's JSON as plain dicts (``_preload_content=False``: no model round trip, and what the
plugin reads is exactly what the API said). Each call names the verb and resource it needs, so a 403 says which
permission is missing, in the message and in the status report.

| answer | code |
|---|---|
| 401 | ``auth_failed`` (the token was refused) |
| 403 "exceeded quota" / "forbidden: ... quota" | ``quota_exceeded`` (the ResourceQuota admission refused it) |
| 403 otherwise | ``auth_failed``, naming the verb and resource |
| 404, 409 | raised as ``ApiError`` with the status, for the caller to decide (gone, AlreadyExists) |
| 410 | ``ApiError`` (an expired ``continue`` token) |
| 422, 400 | ``invalid_request`` (the pod spec the template makes is refused) |
| 429, 5xx | ``throttled``, with the server's ``Retry-After`` |
| no answer (refused, TLS, timeout) | ``throttled``: a mutation's outcome is unknown; a retry (same op_id) is safe |
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from k8s_plugin.config import Config
from provisionerd.plugin_sdk.errors import PluginError

_MAX_BODY_IN_MESSAGE = 300


class ApiError(PluginError):
    """A refusal the caller may want to handle by its HTTP status (404, 409, 410)."""

    def __init__(self, code: str, message: str, status: int, retry_after: float | None = None) -> None:
        super().__init__(code, message, retry_after)
        self.status = status


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read(1 << 16).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PluginError("auth_failed", f"cannot read the token file {path!r}: {exc}") from None


def make_client(config: Config) -> k8s.ApiClient:
    conf = k8s.Configuration()
    if config.in_cluster:
        from kubernetes.config import load_incluster_config

        load_incluster_config(client_configuration=conf)
    else:
        assert config.api_server is not None and config.token_file is not None
        conf.host = config.api_server
        if config.ca_file:
            conf.ssl_ca_cert = config.ca_file
        token_file = config.token_file
        conf.api_key = {"authorization": _read_token(token_file)}
        conf.api_key_prefix = {"authorization": "Bearer"}

        def refresh(c: k8s.Configuration) -> None:  # a rotated ServiceAccount token is read on every call
            c.api_key["authorization"] = _read_token(token_file)

        conf.refresh_api_key_hook = refresh
    conf.retries = False  # one attempt per call: the daemon owns retries and back-off
    return k8s.ApiClient(conf)


def _status_message(body: Any) -> tuple[str, str]:
    """``(reason, message)`` of a Kubernetes ``Status`` body (both empty when it is not one)."""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return "", ""
    if not isinstance(doc, dict):
        return "", ""
    return str(doc.get("reason") or ""), str(doc.get("message") or "")[:_MAX_BODY_IN_MESSAGE]


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def classify(exc: ApiException, verb: str, resource: str, namespace: str) -> PluginError:
    status = int(exc.status or 0)
    reason, message = _status_message(exc.body)
    what = f"{verb} {resource} in namespace {namespace!r}"
    if status == 401:
        return PluginError("auth_failed", f"{what}: the API server refused the credentials (401)")
    if status == 403 and "exceeded quota" in message:
        return PluginError("quota_exceeded", f"{what}: {message}")
    if status == 403:
        return PluginError("auth_failed", f"{what}: forbidden (403): the role lacks {verb!r} on {resource!r}")
    if status in (404, 409, 410):
        return ApiError("provider_error", f"{what}: {reason or status}: {message}", status)
    if status in (400, 422):
        return PluginError("invalid_request", f"{what}: refused as invalid ({status} {reason}): {message}")
    if status == 429 or status >= 500:
        retry_after = _retry_after(exc.headers)
        hint = f"; retry after {retry_after:g} s" if retry_after is not None else ""
        return ApiError("throttled", f"{what}: the API server answered {status} {reason}{hint}", status, retry_after)
    return PluginError("provider_error", f"{what}: unexpected answer {status} {reason}: {message}")


class Api:
    """The calls the plugin makes, in one namespace. Each verb here is in ``rbac.yaml`` and in ``VERBS``."""

    #: (verb, resource) pairs the plugin needs; the status report checks each with a SelfSubjectAccessReview.
    VERBS = (
        ("create", "pods"),
        ("get", "pods"),
        ("list", "pods"),
        ("patch", "pods"),
        ("delete", "pods"),
        ("create", "secrets"),
        ("get", "secrets"),
        ("delete", "secrets"),
        ("list", "resourcequotas"),
    )

    #: Cluster-wide reads for node capacity, granted only by the OPTIONAL ClusterRole in ``rbac-nodes.yaml``.
    NODE_VERBS = (("list", "nodes"), ("list", "pods"))

    def __init__(self, config: Config, api_client: k8s.ApiClient | None = None) -> None:
        self.config = config
        self.namespace = config.namespace
        self._client = api_client or make_client(config)
        self.core = k8s.CoreV1Api(self._client)
        self.authz = k8s.AuthorizationV1Api(self._client)
        self.version = k8s.VersionApi(self._client)

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self.config.request_timeout, **kwargs)
        except ApiException as exc:
            raise classify(exc, verb, resource, self.namespace) from None
        except (urllib3.exceptions.HTTPError, ssl.SSLError, OSError) as exc:
            mutation = verb in ("create", "patch", "delete")
            detail = "; the outcome is unknown, a retry with the same op_id is safe" if mutation else ""
            raise PluginError(
                "throttled",
                f"{verb} {resource}: the API server did not answer ({type(exc).__name__}){detail}",
            ) from None
        try:
            return json.loads(response.data)
        except ValueError:
            raise PluginError("provider_error", f"{verb} {resource}: the API server's answer is not JSON") from None

    # pods
    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create", "pods", self.core.create_namespaced_pod, self.namespace, body)

    def get_pod(self, name: str) -> dict[str, Any]:
        return self._call("get", "pods", self.core.read_namespaced_pod, name, self.namespace)

    def list_pods(self, selector: str, limit: int, token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"label_selector": selector, "limit": limit}
        if token:
            kwargs["_continue"] = token
        return self._call("list", "pods", self.core.list_namespaced_pod, self.namespace, **kwargs)

    def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("patch", "pods", self.core.patch_namespaced_pod, name, self.namespace, patch)

    def delete_pod(self, name: str, uid: str) -> dict[str, Any]:
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        return self._call("delete", "pods", self.core.delete_namespaced_pod, name, self.namespace, body=body)

    # secrets
    def create_secret(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create", "secrets", self.core.create_namespaced_secret, self.namespace, body)

    def get_secret(self, name: str) -> dict[str, Any]:
        return self._call("get", "secrets", self.core.read_namespaced_secret, name, self.namespace)

    def delete_secret(self, name: str, uid: str) -> dict[str, Any]:
        body = {"preconditions": {"uid": uid}}
        return self._call("delete", "secrets", self.core.delete_namespaced_secret, name, self.namespace, body=body)

    # capacity and status
    def list_quotas(self) -> dict[str, Any]:
        return self._call("list", "resourcequotas", self.core.list_namespaced_resource_quota, self.namespace)

    def server_version(self) -> dict[str, Any]:
        return self._call("get", "version", self.version.get_code)

    # nodes (optional: rbac-nodes.yaml)
    def list_nodes(self, limit: int) -> dict[str, Any]:
        return self._call("list", "nodes (cluster-wide)", self.core.list_node, limit=limit)

    def list_bound_pods(self, limit: int) -> dict[str, Any]:
        """Pods of every namespace that are bound to a node (for their requests)."""
        return self._call(
            "list",
            "pods (cluster-wide)",
            self.core.list_pod_for_all_namespaces,
            field_selector="spec.nodeName!=",
            limit=limit,
        )

    def can_i(self, verb: str, resource: str, cluster_wide: bool = False) -> tuple[bool, str]:
        attributes = {"verb": verb, "resource": resource}
        if not cluster_wide:
            attributes["namespace"] = self.namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        doc = self._call("create", "selfsubjectaccessreviews", self.authz.create_self_subject_access_review, body)
        status = doc.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or "")[:_MAX_BODY_IN_MESSAGE]
