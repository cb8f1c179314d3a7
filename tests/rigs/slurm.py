"""A throw-away Slurm cluster for the integration tests (``.ci/slurm-up.sh``: munged, slurmctld and two slurmd on
loopback, partition ``pvd`` of nodes n1 and n2 with 2 CPUs each) and the Slurm plugin's test configuration.

``running_cluster`` is the session fixture's body: the cluster up, and at the end its daemons stopped and any process
still naming its directory killed and reported (a test that leaks a pilot or an agent fails the session).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from rigs import backends, procs, scan, wait
from rigs.plugin import Persistent, Plugin

REPO = Path(__file__).resolve().parents[2]
UP_SCRIPT = REPO / ".ci" / "slurm-up.sh"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "sacct")
PLUGIN = Plugin(REPO / "providers" / "slurm", "slurm.json", "slurm", settle_limit=30.0)
#: Job states after which a job is over (squeue ``-t all`` still lists it for a while).
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


@attrs.frozen
class SlurmTestCluster:
    """A running cluster made by ``.ci/slurm-up.sh`` (partition ``pvd``, nodes n1, n2: 2 CPUs each)."""

    root: Path
    conf: Path
    workdir: Path
    certs: Path
    port: int
    partition: str = "pvd"

    @property
    def env(self) -> dict[str, str]:
        """What the Slurm commands and daemons need: ``SLURM_CONF`` and a PATH with the sbin directories."""
        return {"PATH": backends.SBIN_PATH, "SLURM_CONF": str(self.conf), "SLURM_UP_PORT": str(self.port)}

    def run(
        self, *argv: str, check: bool = True, timeout: float = 30.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster (its output); ``check``: fail the test on a non-zero exit."""
        done = procs.run(argv, env=self.env, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"{argv} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def jobs(self) -> dict[str, dict[str, str]]:
        """Every job slurmctld knows, any state: id -> {state, nodes, name, comment}."""
        out = self.run("squeue", "-h", "-t", "all", "-O", "JobID:|,State:|,NodeList:|,Name:|,Comment:|").stdout
        found = {}
        for line in out.splitlines():
            job_id, state, nodes, name, comment = line.split("|", 4)
            found[job_id] = {"state": state, "nodes": nodes, "name": name, "comment": comment.rstrip("|")}
        return found

    def live_jobs(self) -> dict[str, dict[str, str]]:
        return {j: info for j, info in self.jobs().items() if info["state"] not in ENDED}

    def tagged_jobs(self, tag: str, live: bool = True) -> dict[str, dict[str, str]]:
        """The jobs whose comment carries ``tag`` (an owner tag); ``live``: only those not ended."""
        jobs = self.jobs()
        return {j: info for j, info in jobs.items() if tag in info["comment"] and not (live and info["state"] in ENDED)}

    def cancel_everything(self) -> None:
        """End every job in this (throw-away) cluster and wait until none is live."""
        self.run("scancel", f"--user={getpass.getuser()}", check=False)
        wait.blocking("all jobs of the test cluster to end", lambda: not self.live_jobs(), 30, interval=0.2)

    def ctld_pid(self) -> int:
        return int((self.root / "slurmctld.pid").read_text())

    def up(self) -> str:
        """Start (or restart, from its saved state) the cluster's daemons."""
        done = procs.run([UP_SCRIPT, "up", self.root], env=self.env, timeout=90)
        if done.returncode != 0:
            raise AssertionError(f"slurm-up.sh failed ({done.returncode}): {done.stdout}\n{done.stderr}")
        return done.stdout


def free_port_base() -> int:
    """A port P with P, P+1, P+2 free on 127.0.0.1 right now (slurmctld and the two slurmd)."""
    for _ in range(200):
        base = wait.free_port()
        if base > 65000:
            continue
        held: list[socket.socket] = []
        try:
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


@contextmanager
def running_cluster() -> Iterator[SlurmTestCluster]:
    """The cluster, up; at the end every daemon stopped and nothing left that names its directory."""
    for tool in TOOLS:
        backends.need(tool, "Debian: slurm-wlm slurmctld slurmd munge")
    # A short path: munged's socket lives under it (unix socket paths are limited to ~107 bytes).
    root = Path(tempfile.mkdtemp(prefix="pvd-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    from provisionerd.pki.certs import init_certs

    certs = root / "certs"
    init_certs(certs, "slurmtest")
    cluster = SlurmTestCluster(
        root=root, conf=root / "slurm.conf", workdir=root / "work", certs=certs, port=free_port_base()
    )
    try:
        cluster.up()
        yield cluster
    finally:
        procs.run([UP_SCRIPT, "down", root], env=cluster.env, timeout=60)
        survivors = scan.processes_mentioning(str(root))
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait.blocking("the killed survivors to be gone", lambda: not scan.processes_mentioning(str(root)), 10)
        shutil.rmtree(root, ignore_errors=True)
        assert not survivors, f"processes outlived the Slurm test cluster: {survivors}"


def plugin_config(cluster: SlurmTestCluster, **overrides: Any) -> dict[str, Any]:
    """The plugin's test configuration: this cluster, the agent run by this interpreter, five templates."""
    config: dict[str, Any] = {
        "partition": cluster.partition,
        "workdir": str(cluster.workdir),
        "slurmConf": str(cluster.conf),
        "accounting": "jobcomp",
        "commandTimeout": 20,
        "agent": {
            "command": [sys.executable, "-m", "provisionerd", "agent"],
            "certs": str(cluster.certs),
            "extraArgs": ["--log-level", "DEBUG"],
        },
        "templates": [
            {"templateId": "node", "maxNumber": 2, "cpus": 2, "memMB": 400},
            {"templateId": "small", "maxNumber": 4, "cpus": 1, "memMB": 100},
            {"templateId": "short", "maxNumber": 1, "cpus": 1, "memMB": 100, "timeLimit": "2"},
            {"templateId": "wide", "maxNumber": 1, "cpus": 3},
            {"templateId": "huge", "maxNumber": 1, "cpus": 64},
        ],
    }
    config.update(overrides)
    return config


def persistent(home: Path, config: Mapping[str, Any], cluster_tag: str) -> Persistent:
    """The Slurm plugin over its persistent transport."""
    return Persistent(PLUGIN, home, config, cluster_tag)
