"""The Kubernetes tests run against a real control plane started by ``.ci/k8s-control-plane`` (one per session,
``rigs.k8s``): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok with 3 fake nodes, on loopback.

The binaries are built once per version and cached (``.ci/run`` builds them before the tests). When the cache is
incomplete the fixture builds them (minutes); only with ``PROVISIONERD_K8S_SKIP=1`` does it skip instead. A control
plane that does not come up is always a failure. At the end every process it started is stopped.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from rigs.k8s import ControlPlane, Namespace, persistent, running_control_plane
from rigs.plugin import Persistent

_names = itertools.count(1)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with running_control_plane() as plane:
        yield plane


@pytest.fixture
def namespace(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Namespace]:
    ns = Namespace(control_plane, f"t{os.getpid()}-{next(_names)}", tmp_path / "ns")
    yield ns
    ns.delete()


@pytest.fixture
def plugin(namespace: Namespace, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Persistent]:
    client = persistent(tmp_path / "plugin", namespace.config(), f"c-{request.node.name}"[:60])
    yield client
    client.close()
