"""The Slurm tests run against a real cluster started by ``.ci/slurm-up.sh`` (one per test session). Without the
Slurm binaries the tests are skipped, except in CI (``CI=true``), where that is a failure (``rigs.backends``;
``make test-integration`` installs them). A cluster that does not come up is always a failure. At the end of the
session every job is cancelled, the daemons are stopped, and any process still mentioning the cluster's directory
is killed (by pid) and reported.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rigs import backends

sys.path.insert(0, str(Path(__file__).resolve().parent))  # importlib mode: make slurm_helpers importable

from slurm_helpers import (  # noqa: E402
    TOOLS,
    UP_SCRIPT,
    Persistent,
    SlurmTestCluster,
    plugin_config,
    processes_mentioning,
)

_SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _free_port_base() -> int:
    """A port P with P, P+1, P+2 free on 127.0.0.1 right now (slurmctld and the two slurmd)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base > 65000:
            continue
        try:
            held = []
            for port in (base, base + 1, base + 2):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no three consecutive free ports")


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmTestCluster]:
    for tool in TOOLS:
        backends.need(tool, "Debian: slurm-wlm slurmctld slurmd munge")
    # A short path: munged's socket lives under it (unix socket paths are limited to ~107 bytes).
    root = Path(tempfile.mkdtemp(prefix="pvd-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    from provisionerd.pki.certs import init_certs

    certs = root / "certs"
    init_certs(certs, "slurmtest")
    cluster = SlurmTestCluster(
        root=root, conf=root / "slurm.conf", workdir=root / "work", certs=certs, port=_free_port_base()
    )
    try:
        cluster.up()
        yield cluster
    finally:
        subprocess.run([str(UP_SCRIPT), "down", str(root)], env=cluster.env, capture_output=True, timeout=60)
        survivors = processes_mentioning(str(root))
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1 if survivors else 0)
        shutil.rmtree(root, ignore_errors=True)
        assert not survivors, f"processes outlived the Slurm test cluster: {survivors}"


@pytest.fixture
def clean_cluster(slurm: SlurmTestCluster) -> Iterator[SlurmTestCluster]:
    """The cluster with no job live before and after the test (the nodes are free for the next one)."""
    slurm.cancel_everything()
    yield slurm
    slurm.cancel_everything()


@pytest.fixture
def plugin(clean_cluster: SlurmTestCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Persistent]:
    """The plugin over its persistent transport, with the default test configuration and a cluster tag unique to
    this test (the one-shot transport has its own tests and the conformance kit runs both)."""
    client = Persistent(tmp_path, plugin_config(clean_cluster), f"t-{request.node.name}"[:60])
    yield client
    client.close()
