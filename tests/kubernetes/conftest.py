"""The Kubernetes tests run against a real control plane started by ``.ci/k8s-control-plane`` (one per session):
etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok with 3 fake nodes, on loopback.

The binaries are built once per version and cached (``.ci/run`` builds them before the tests). When the cache is
incomplete the fixture builds them (minutes); only with ``PROVISIONERD_K8S_SKIP=1`` does it skip instead. A control
plane that does not come up is always a failure. At the end every process it started is stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rigs import backends

sys.path.insert(0, str(Path(__file__).resolve().parent))  # importlib mode: make k8s_helpers importable

from k8s_helpers import SCRIPT, ControlPlane, Namespace, Persistent  # noqa: E402


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    cached = subprocess.run([str(SCRIPT), "path"], capture_output=True, text=True).returncode == 0
    if not cached and os.environ.get("PROVISIONERD_K8S_SKIP") == "1":
        backends.missing("the Kubernetes control plane is not built and PROVISIONERD_K8S_SKIP=1")
    if not cached:
        built = subprocess.run([str(SCRIPT), "build"], capture_output=True, text=True, timeout=3600)
        assert built.returncode == 0, f".ci/k8s-control-plane build failed:\n{built.stderr[-4000:]}"
    root = Path(tempfile.mkdtemp(prefix="pvd-k8s-", dir="/tmp"))
    try:
        up = subprocess.run([str(SCRIPT), "start", str(root)], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, f"the control plane did not start:\n{up.stderr[-4000:]}"
        yield ControlPlane(root)
    finally:
        subprocess.run([str(SCRIPT), "stop", str(root)], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


_count = 0


@pytest.fixture
def namespace(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Namespace]:
    global _count
    _count += 1
    ns = Namespace(control_plane, f"t{os.getpid()}-{_count}", tmp_path / "ns")
    yield ns
    ns.delete()


@pytest.fixture
def plugin(namespace: Namespace, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Persistent]:
    client = Persistent(tmp_path / "plugin", namespace.config(), f"c-{request.node.name}"[:60])
    yield client
    client.close()
