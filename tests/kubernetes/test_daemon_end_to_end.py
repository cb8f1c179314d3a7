"""The whole daemon on Kubernetes: the reference controller (in this process, real TLS sockets), the real
``DaemonCore`` and the Kubernetes plugin over its persistent transport, as its ServiceAccount, against the real API
server.

Containers do not run here, so a small stand-in kubelet (``StandInKubelet``) does what a kubelet would for each of
our pods kwok marks Running: it reads the pod's command, env and Secret from the API, writes the Secret's key where
the pod mounts it (a private directory of the test instead of the container's path) and starts the command as a
local process; it stops the process when the pod is gone. Demand 3 gives 3 pods whose agents join; demand 0 gives
the pods and their Secrets back; a foreign pod and a foreign Secret in the namespace stay.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from k8s_helpers import PLUGIN, Namespace

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    ProviderConfig,
    ProviderTimeouts,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.clients import provider_clients
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import DemandItem, InstanceFact, RequestIntent, ResourceShape, Returned
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.pki.certs import init_certs
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import PluginClient
from provisionerd.provider.persistent import PersistentProvider
from refcontroller.api import open_refcontroller

pytestmark = pytest.mark.integration

PROVIDER = "k8s"
CLUSTER_TAG = "e2e-k8s"
TOKEN_DIR = "/var/run/provisionerd/join"


class StandInKubelet:
    """Starts the command of each Running pod of ours as a local process (see the module docstring)."""

    def __init__(self, namespace: Namespace, root: Path) -> None:
        self.ns, self.root = namespace, root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StandInKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for proc in self.procs.values():
            self._end(proc)

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            pods = {p.metadata.name: p for p in self.ns.plane.core.list_namespaced_pod(self.ns.name).items}
            for name, proc in list(self.procs.items()):
                pod = pods.get(name)
                if pod is None or pod.metadata.deletion_timestamp is not None:
                    self._end(proc)  # the kubelet stops the containers of a pod being deleted
                    del self.procs[name]
            for name, pod in pods.items():
                ours = (pod.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "provisionerd"
                if ours and pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
                    if name not in self.procs and name not in self.started:
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
            self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
        self.started.append(name)


def write_config(tmp: Path, namespace: Namespace, certs: Path, addresses: tuple[str, ...]) -> Config:
    import json

    conf_dir, data_dir = tmp / "k8s-conf", tmp / "k8s-data"
    conf_dir.mkdir()
    data_dir.mkdir()
    plugin = namespace.config(
        agent={"certs": str(certs), "command": [sys.executable, "-m", "provisionerd", "agent"]},
    )
    plugin["templates"] = [t for t in plugin["templates"] if t["templateId"] == "small"]
    (conf_dir / "kubernetes.json").write_text(json.dumps(plugin))
    config = Config(
        cluster=CLUSTER_TAG,
        identity="prov-k8s-e2e",
        controller=ControllerSettings(
            addresses,
            connect_timeout=10,
            request_timeout=10,
            heartbeat_interval=0.5,
            heartbeat_timeout=10,
            backoff=Backoff(initial=0.05, max=0.5),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=tmp / "events.jsonl"),
        providers=(
            ProviderConfig(
                PROVIDER,
                "persistent",
                path=PLUGIN,
                conf_dir=conf_dir,
                data_dir=data_dir,
                max_machines=3,
                timeouts=ProviderTimeouts(default=40),
            ),
        ),
    )
    return write_daemon_config(config, tmp / "pd.toml")


def facts_of(ctl: Any, kind: type) -> list[Any]:
    assert ctl.server is not None
    return [c.fact for c in ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]


async def poll(predicate: Any, limit: float, what: str, interval: float = 0.3) -> Any:
    with trio.move_on_after(limit):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(interval)
    raise AssertionError(f"timed out after {limit:g} s waiting for {what}")


def test_the_daemon_grows_onto_kubernetes_and_shrinks_back(namespace: Namespace, tmp_path: Path) -> None:
    core = namespace.plane.core
    spec = {"containers": [{"name": "c", "image": "x"}], "automountServiceAccountToken": False}
    core.create_namespaced_pod(namespace.name, {"metadata": {"name": "foreign"}, "spec": spec})
    core.create_namespaced_secret(namespace.name, {"metadata": {"name": "foreign"}, "stringData": {"k": "v"}})
    with StandInKubelet(namespace, tmp_path / "kubelet") as kubelet:
        out = trio.run(_scenario, namespace, tmp_path)
    intents = [f for f in out["facts"] if isinstance(f, RequestIntent)]
    made = out["made"]  # the instance facts once the agents had joined and been named
    assert sum(i.count for i in intents) == 3 and len(made) == 3
    assert {f.machine_id for f in made} == set(out["pods_up"]) == set(kubelet.started)
    assert {(h["instance_ref"], h["machine_id"]) for h in out["hosts"]} == {
        (f.instance_ref, f.machine_id) for f in made
    }
    assert {m for f in out["facts"] if isinstance(f, Returned) for m in f.machine_ids} == set(out["pods_up"])
    # all_facts is the whole log: the ended lifecycles left the resync set, not the log.
    assert {f.machine_id for f in out["facts"] if isinstance(f, InstanceFact)} == set(out["pods_up"])
    pods, secrets = namespace.pods(), namespace.secrets()
    assert not set(out["pods_up"]) & set(pods) and not set(out["pods_up"]) & set(secrets)
    assert "foreign" in pods and pods["foreign"].metadata.deletion_timestamp is None and "foreign" in secrets
    for token in out["tokens"]:
        assert token not in out["events"]


async def _scenario(namespace: Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    certs = tmp / "certs"
    init_certs(certs, CLUSTER_TAG)
    async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.5) as ctl:
        config = write_config(tmp, namespace, certs, ctl.addresses)
        client = provider_clients(config)[PROVIDER].transport
        assert isinstance(client, PersistentProvider)
        tokens: list[str] = []

        class Recorder:
            name = client.name

            async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
                if action == "requestMachines":
                    tokens.extend(b["joinToken"] for b in input["bootstrap"])
                return await client.call(action, input, timeout=timeout)

            async def aclose(self) -> None:
                await client.aclose()

        policy = Policy(
            cluster=CLUSTER_TAG,
            idle_time=1.0,
            join_deadline=120.0,
            provisioning_timeout=120.0,
            capacity_backoff=60.0,
            provider_caps={PROVIDER: 3},
        )
        daemon = DaemonCore(
            config,
            providers={PROVIDER: PluginClient(Recorder())},
            policy=policy,
            offer_interval=10.0,
            loop_settings=LoopSettings(replan_interval=0.5, reclaim_interval=5.0, recover_after=10.0),
            executor_settings=ExecutorSettings(
                cluster=CLUSTER_TAG,
                controllers=ctl.addresses,
                poll_initial=0.2,
                poll_max=1.0,
                retry_delay=0.2,
                provisioning_timeout=120.0,
                return_timeout=120.0,
            ),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            await nursery.start(daemon.run)
            try:
                await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=1), 3)])

                async def joined() -> tuple[list[dict[str, Any]], list[InstanceFact]] | None:
                    # An agent may join on its intent's token before the daemon commits its InstanceFact
                    # (refcontroller/workers.py): the daemon commits the facts of a request once it is final, i.e.
                    # once the plugin reports every pod Running, seen at its next poll, and the last pod's agent
                    # usually joins before that. Its host has no machine id until the fact names it.
                    hosts = [h for h in (await ctl.status())["hosts"] if h["provider"] == PROVIDER]
                    made = facts_of(ctl, InstanceFact)
                    up = len(hosts) == 3 and all(h["status"] in ("joined", "idle") for h in hosts)
                    named = all(h["machine_id"] for h in hosts) and len(made) == 3
                    return (hosts, made) if up and named else None

                out["hosts"], out["made"] = await poll(joined, 120, "three agents joined and their instance facts")
                out["pods_up"] = {f.machine_id for f in out["made"]}
                assert len(out["pods_up"]) == 3  # else the waits below for these machines would pass at once
                await ctl.set_demand([])
                returned = lambda: {m for f in facts_of(ctl, Returned) for m in f.machine_ids}  # noqa: E731
                await poll(lambda: returned() >= out["pods_up"], 90, "three machines Returned")

                def gone() -> bool:
                    pods, secrets = namespace.pods(), namespace.secrets()
                    return not (out["pods_up"] & set(pods)) and not (out["pods_up"] & set(secrets))

                await poll(lambda: trio.to_thread.run_sync(gone), 60, "the pods and Secrets to be gone")
                out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
            finally:
                with trio.CancelScope(shield=True):
                    await daemon.release_leases()
                nursery.cancel_scope.cancel()
        daemon.events.close()
    out["events"] = (tmp / "events.jsonl").read_text()
    out["tokens"] = tokens
    return out
