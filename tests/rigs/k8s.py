"""A real Kubernetes control plane for the integration tests (``.ci/k8s-control-plane``: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok with 3 fake nodes, on loopback), an administrator's client, a
namespace per test with the plugin's Role (``providers/kubernetes/rbac.yaml``), and the plugin's test configuration.

Named ``k8s``, not ``kubernetes``: a module of that name would shadow the Kubernetes client package.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from provisionerd.config.loader import Config
from rigs import backends, core, procs, wait
from rigs.plugin import Persistent, Plugin

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "k8s-control-plane"
PLUGIN = Plugin(ROOT / "providers" / "kubernetes", "kubernetes.json", "k8s", settle_limit=60.0)
RBAC = PLUGIN.path / "rbac.yaml"
#: Where a pod of ours mounts its Secret (the join token).
TOKEN_DIR = "/var/run/provisionerd/join"


class ControlPlane:
    """A running control plane (its ``env`` file under ``root``) and the administrator's API clients."""

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


@contextmanager
def running_control_plane() -> Iterator[ControlPlane]:
    """The control plane, built first if its cache is incomplete (minutes; ``PROVISIONERD_K8S_SKIP=1`` skips
    instead), started, and at the end every process it started stopped. One that does not come up fails."""
    cached = procs.run([SCRIPT, "path"]).returncode == 0
    if not cached and os.environ.get("PROVISIONERD_K8S_SKIP") == "1":
        backends.missing("the Kubernetes control plane is not built and PROVISIONERD_K8S_SKIP=1")
    if not cached:
        built = procs.run([SCRIPT, "build"], timeout=3600)
        assert built.returncode == 0, f".ci/k8s-control-plane build failed:\n{built.stderr[-4000:]}"
    root = Path(tempfile.mkdtemp(prefix="pvd-k8s-", dir="/tmp"))
    try:
        up = procs.run([SCRIPT, "start", root], timeout=300)
        assert up.returncode == 0, f"the control plane did not start:\n{up.stderr[-4000:]}"
        yield ControlPlane(root)
    finally:
        procs.run([SCRIPT, "stop", root], timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def exists(read: Callable[[], Any]) -> bool:
    """Whether ``read()`` finds its object (False on 404; any other API error is raised)."""
    try:
        read()
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


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
        wait.blocking(
            f"the default ServiceAccount of namespace {name}",
            lambda: exists(lambda: core.read_namespaced_service_account("default", name)),
            30,
            interval=0.2,
        )
        token = core.create_namespaced_service_account_token(
            "provisionerd", name, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        home.mkdir(parents=True, exist_ok=True)
        self.token_file = home / "sa-token"
        self.token_file.write_text(token)
        os.chmod(self.token_file, 0o600)

    def config(self, **overrides: Any) -> dict[str, Any]:
        """The plugin's test configuration in this namespace: templates ``small`` and ``nowhere`` (whose
        nodeSelector matches no node)."""
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


def persistent(home: Path, config: Mapping[str, Any], cluster_tag: str) -> Persistent:
    """The Kubernetes plugin over its persistent transport, as the namespace's ServiceAccount (``config``)."""
    return Persistent(PLUGIN, home, config, cluster_tag)


def end_to_end_config(home: Path, namespace: Namespace, certs: Path, addresses: Sequence[str], cluster: str) -> Config:
    """A daemon's config (written to ``home/pd.toml``, ``rigs.core`` timings) with the plugin as the namespace's
    ServiceAccount: template ``small`` only, at most 3 machines, agents run by this interpreter with ``certs``."""
    plugin = namespace.config(agent={"certs": str(certs), "command": [sys.executable, "-m", "provisionerd", "agent"]})
    plugin["templates"] = [t for t in plugin["templates"] if t["templateId"] == "small"]
    provider = PLUGIN.provider_config(home, plugin, max_machines=3, timeouts=core.END_TO_END_TIMEOUTS)
    return core.end_to_end_config(home, certs, addresses, provider, cluster=cluster, identity=f"prov-{cluster}")


def secret_token(secret: Any) -> str:
    """The join token a pod's Secret holds."""
    return base64.b64decode(secret.data["token"]).decode()


class StandInKubelet:
    """Containers do not run under kwok, so this does what a kubelet would for each pod of ours kwok marks Running:
    it reads the pod's command, env and Secret from the API, writes the Secret's keys where the pod mounts them (a
    private directory under ``root`` instead of the container's path) and starts the command as a local process
    in its own session; it stops the process (SIGTERM, 10 s, SIGKILL of its group) when the pod is gone or being
    deleted, and at the end. ``started``: the pods whose command it started."""

    def __init__(self, namespace: Namespace, root: Path) -> None:
        self.ns, self.root = namespace, root
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StandInKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for proc in self.running.values():
            procs.stop_popen(proc)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            pods = {p.metadata.name: p for p in self.ns.plane.core.list_namespaced_pod(self.ns.name).items}
            for name, proc in list(self.running.items()):
                pod = pods.get(name)
                if pod is None or pod.metadata.deletion_timestamp is not None:
                    procs.stop_popen(proc)  # the kubelet stops the containers of a pod being deleted
                    del self.running[name]
            for name, pod in pods.items():
                ours = (pod.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "provisionerd"
                if ours and pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
                    if name not in self.running and name not in self.started:
                        self._start(pod)

    def _start(self, pod: Any) -> None:
        name = pod.metadata.name
        (container,) = pod.spec.containers
        (volume,) = [v for v in pod.spec.volumes if v.secret]
        secret = self.ns.plane.core.read_namespaced_secret(volume.secret.secret_name, self.ns.name)
        mount = self.root / name / "join"
        mount.mkdir(parents=True, mode=0o700)
        for key, value in secret.data.items():
            path = mount / key
            path.write_bytes(base64.b64decode(value))
            os.chmod(path, 0o400)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        for var in container.env or []:
            env[var.name] = name if var.value_from and var.value_from.field_ref else var.value
        argv = [a.replace(TOKEN_DIR, str(mount)).replace("$(POD_NAME)", env["POD_NAME"]) for a in container.command]
        with open(self.root / f"{name}.log", "wb") as log:
            self.running[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
        self.started.append(name)
