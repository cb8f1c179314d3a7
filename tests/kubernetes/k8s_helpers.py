"""Helpers of tests/kubernetes: the control plane, an administrator's client, a namespace with the plugin's Role,
and the plugin over its persistent transport."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "providers" / "kubernetes"
SCRIPT = ROOT / ".ci" / "k8s-control-plane"
RBAC = PLUGIN / "rbac.yaml"
NO_CONTROLLER = "127.0.0.1:9"  # a bootstrap needs addresses; these pods' agents never run under kwok alone
T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 30.0, what: str = "a condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


class ControlPlane:
    def __init__(self, root: Path) -> None:
        self.root = root
        env = dict(line.split("=", 1) for line in (root / "env").read_text().splitlines() if "=" in line)
        self.url = env["KUBE_API"]
        self.ca = env["KUBE_CA"]
        conf = k8s.Configuration()
        conf.host = self.url
        conf.ssl_ca_cert = env["KUBE_CA"]
        conf.cert_file = env["KUBE_ADMIN_CERT"]
        conf.key_file = env["KUBE_ADMIN_KEY"]
        self.admin = k8s.ApiClient(conf)
        self.core = k8s.CoreV1Api(self.admin)
        self.rbac = k8s.RbacAuthorizationV1Api(self.admin)


class Namespace:
    """A namespace of its own for one test, with rbac.yaml applied (less ``drop`` verbs) and a token of the
    ServiceAccount it binds: the plugin runs as that ServiceAccount, never as the administrator."""

    def __init__(self, plane: ControlPlane, name: str, home: Path, drop: tuple[tuple[str, str], ...] = ()) -> None:
        self.plane, self.name, self.home = plane, name, home
        core = plane.core
        core.create_namespace({"metadata": {"name": name}})
        for doc in yaml.safe_load_all(RBAC.read_text()):
            doc["metadata"]["namespace"] = name
            if doc["kind"] == "ServiceAccount":
                core.create_namespaced_service_account(name, doc)
            elif doc["kind"] == "Role":
                for rule in doc["rules"]:
                    rule["verbs"] = [v for v in rule["verbs"] if (v, rule["resources"][0]) not in drop]
                plane.rbac.create_namespaced_role(name, doc)
            else:
                for subject in doc["subjects"]:
                    subject["namespace"] = name
                plane.rbac.create_namespaced_role_binding(name, doc)
        # Pods need the namespace's default ServiceAccount (the controller manager makes it).
        wait_for(lambda: _exists(lambda: core.read_namespaced_service_account("default", name)), 30, "default SA")
        token = core.create_namespaced_service_account_token(
            "provisionerd", name, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        home.mkdir(parents=True, exist_ok=True)
        self.token_file = home / "sa-token"
        self.token_file.write_text(token)
        os.chmod(self.token_file, 0o600)

    def config(self, **overrides: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "apiServer": self.plane.url,
            "caFile": self.plane.ca,
            "tokenFile": str(self.token_file),
            "namespace": self.name,
            "requestTimeout": 10,
            "agent": {"certs": "/etc/provisionerd/certs", "command": ["provisionerd", "agent"]},
            "templates": [
                {
                    "templateId": "small",
                    "maxNumber": 6,
                    "image": "provisionerd-agent:test",
                    "cpu": "500m",
                    "memory": "256Mi",
                },
                {
                    "templateId": "nowhere",
                    "maxNumber": 2,
                    "image": "provisionerd-agent:test",
                    "cpu": "1",
                    "memory": "256Mi",
                    "nodeSelector": {"no-such-label": "x"},
                },
            ],
        }
        config.update(overrides)
        return config

    def pods(self) -> dict[str, Any]:
        return {p.metadata.name: p for p in self.plane.core.list_namespaced_pod(self.name).items}

    def secrets(self) -> dict[str, Any]:
        return {s.metadata.name: s for s in self.plane.core.list_namespaced_secret(self.name).items}

    def delete(self) -> None:
        try:
            self.plane.core.delete_namespace(self.name)
        except ApiException:
            pass


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


class Persistent:
    """The ``provider`` executable: one process, one JSON line per request and per answer (one call at a time)."""

    def __init__(self, home: Path, config: Mapping[str, Any], cluster_tag: str, provider: str = "k8s") -> None:
        self.home = home
        self.conf_dir = home / "conf"
        self.data_dir = home / "data"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        (self.conf_dir / "kubernetes.json").write_text(json.dumps(config))
        self.cluster_tag = cluster_tag
        self.provider = provider
        self.tokens: list[str] = []
        self.outputs: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "PROVIDER_NAME": self.provider,
            "PRO_CONF_DIR": str(self.conf_dir),
            "PRO_DATA_DIR": str(self.data_dir),
            "PROVISIONERD_CLUSTER": self.cluster_tag,
            "PROVISIONERD_PYTHON": sys.executable,
        }

    def start(self) -> None:
        self.stderr = open(self.home / "provider.stderr", "a")
        self.proc = subprocess.Popen(
            [str(PLUGIN / "provider")],
            env=self.env,
            cwd=self.home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self._id = 0

    def send(self, action: str, doc: Mapping[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self._id += 1
        self.proc.stdin.write(json.dumps({"id": self._id, "action": action, "input": doc}) + "\n")
        self.proc.stdin.flush()

    def invoke(self, action: str, doc: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        self.send(action, doc)
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.outputs.append(line)
        answer = json.loads(line)
        assert answer["id"] == self._id, answer
        return ("result" in answer), answer.get("result", answer.get("error"))

    def call(self, action: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        ok, body = self.invoke(action, doc)
        assert ok, f"{action} failed: {body}"
        return body

    def error(self, action: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        ok, body = self.invoke(action, doc)
        assert not ok, f"{action} was expected to fail: {body}"
        return body

    def close(self) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.close()  # EOF: the plugin finishes and exits
        except BrokenPipeError:
            pass  # it had exited already
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.stderr.close()
        self.outputs.append((self.home / "provider.stderr").read_text())
        self.proc = None

    # inputs
    def owner(self, op_id: str) -> dict[str, str]:
        return {
            "provisionerd:cluster": self.cluster_tag,
            "provisionerd:provider": self.provider,
            "provisionerd:op": op_id,
            "provisionerd:epoch": "3.7",
        }

    def request(self, op_id: str, template: str, count: int, tokens: list[str] | None = None) -> dict[str, Any]:
        tokens = tokens or [secrets.token_urlsafe(24) for _ in range(count)]
        self.tokens += tokens
        boot = [
            {"instanceRef": f"{op_id}-i{i}", "controllers": [NO_CONTROLLER], "joinToken": tokens[i]}
            for i in range(count)
        ]
        return {
            "template": {"templateId": template, "machineCount": count},
            "op_id": op_id,
            "tags": self.owner(op_id),
            "bootstrap": boot,
        }

    def status(self, request_id: str) -> dict[str, Any]:
        return self.call("getRequestStatus", {"requests": [{"requestId": request_id}]})["requests"][0]

    def settle(self, request_id: str, timeout: float = 60.0) -> dict[str, Any]:
        last: list[dict[str, Any]] = []

        def probe() -> dict[str, Any] | None:
            last[:] = [self.status(request_id)]
            return last[0] if last[0]["status"] != "running" else None

        try:
            return wait_for(probe, timeout=timeout, what=f"request {request_id} to settle")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status: {last}") from None

    def listed(self, **tags: str) -> dict[str, dict[str, Any]]:
        out = self.call("listMachines", {"tags": {"provisionerd:cluster": self.cluster_tag, **tags}})
        return {m["machineId"]: m for m in out["machines"]}

    def give_back(self, op_id: str, machines: list[dict[str, Any]]) -> dict[str, Any]:
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines]
        return self.call("requestReturnMachines", {"machines": refs, "op_id": op_id, "tags": self.owner(op_id)})


def secret_token(secret: Any) -> str:
    return base64.b64decode(secret.data["token"]).decode()


def iter_json_strings(doc: Any) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from iter_json_strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from iter_json_strings(v)
