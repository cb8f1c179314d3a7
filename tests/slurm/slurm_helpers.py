"""Helpers for the Slurm tests: the test cluster handle, a one-shot plugin client, polling and /proc scans."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "providers" / "slurm"
UP_SCRIPT = REPO / ".ci" / "slurm-up.sh"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "sacct")
#: Nothing listens on the discard port: an agent pointed there just keeps retrying (enough for these tests).
NO_CONTROLLER = "127.0.0.1:9"
T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = "") -> T:
    """Poll until ``predicate`` returns something truthy (real clock, generous deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


@attrs.frozen
class SlurmTestCluster:
    """A running throw-away cluster made by ``.ci/slurm-up.sh`` (partition ``pvd``, nodes n1, n2: 2 CPUs each)."""

    root: Path
    conf: Path
    workdir: Path
    certs: Path
    port: int
    partition: str = "pvd"

    @property
    def env(self) -> dict[str, str]:
        path = os.pathsep.join([os.environ.get("PATH", "/usr/bin:/bin"), "/usr/sbin", "/sbin"])  # the daemons
        return {**os.environ, "PATH": path, "SLURM_CONF": str(self.conf), "SLURM_UP_PORT": str(self.port)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0, **kw: Any) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
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
        ended = {
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
        return {j: info for j, info in self.jobs().items() if info["state"] not in ended}

    def cancel_everything(self) -> None:
        """End every job in this (throw-away) cluster and wait until none is live."""
        self.run("scancel", f"--user={getpass.getuser()}", check=False)
        wait_for(lambda: not self.live_jobs(), timeout=30, what="all jobs of the test cluster to end")

    def ctld_pid(self) -> int:
        return int((self.root / "slurmctld.pid").read_text())

    def up(self) -> str:
        done = subprocess.run(
            [str(UP_SCRIPT), "up", str(self.root)], env=self.env, capture_output=True, text=True, timeout=90
        )
        if done.returncode != 0:
            raise AssertionError(f"slurm-up.sh failed ({done.returncode}): {done.stdout}\n{done.stderr}")
        return done.stdout


def plugin_config(cluster: SlurmTestCluster, **overrides: Any) -> dict[str, Any]:
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


class PluginClient:
    """Calls the plugin as the daemon's runtime does (same environment shape); keeps every output it saw."""

    def __init__(self, home: Path, config: Mapping[str, Any], cluster_tag: str) -> None:
        self.home = home
        self.conf_dir = home / "conf"
        self.data_dir = home / "data"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        (self.conf_dir / "slurm.json").write_text(json.dumps(config))
        self.cluster_tag = cluster_tag
        self.tokens: list[str] = []
        self.outputs: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "PROVIDER_NAME": "slurm",
            "PRO_CONF_DIR": str(self.conf_dir),
            "PRO_DATA_DIR": str(self.data_dir),
            "PROVISIONERD_CLUSTER": self.cluster_tag,
            "PROVISIONERD_PYTHON": sys.executable,
        }

    def invoke(self, action: str, doc: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def call(self, action: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        """The result document; fails the test on an error."""
        ok, body = self.invoke(action, doc)
        assert ok, f"{action} failed: {body}"
        return body

    def error(self, action: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        """The error body of a call that must fail."""
        ok, body = self.invoke(action, doc)
        assert not ok, f"{action} was expected to fail: {body}"
        return body

    # --- inputs ----------------------------------------------------------------------------------------------

    def owner(self, op_id: str) -> dict[str, str]:
        return {
            "provisionerd:cluster": self.cluster_tag,
            "provisionerd:provider": "slurm",
            "provisionerd:op": op_id,
            "provisionerd:epoch": "3.7",
        }

    def request(
        self,
        op_id: str,
        template: str,
        count: int,
        controllers: tuple[str, ...] = (NO_CONTROLLER,),
        tokens: list[str] | None = None,
    ) -> dict[str, Any]:
        tokens = tokens or [secrets.token_urlsafe(24) for _ in range(count)]
        self.tokens += tokens
        boot = [
            {"instanceRef": f"{op_id}-i{i}", "controllers": list(controllers), "joinToken": tokens[i]}
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

    def settle(self, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status(request_id))["status"] != "running" and s,
            timeout=timeout,
            what=f"request {request_id} to settle",
        )

    def listed(self, **tags: str) -> dict[str, dict[str, Any]]:
        out = self.call("listMachines", {"tags": {"provisionerd:cluster": self.cluster_tag, **tags}})
        return {m["machineId"]: m for m in out["machines"]}

    def give_back(self, op_id: str, machines: list[dict[str, Any]]) -> dict[str, Any]:
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines]
        return self.call("requestReturnMachines", {"machines": refs, "op_id": op_id, "tags": self.owner(op_id)})


class OneShot(PluginClient):
    """``<action>.sh -f in.json``: exit 0 and a result, or exit 1 and an error document."""

    _n = 0

    def start(self, action: str, doc: Mapping[str, Any]) -> subprocess.Popen[str]:
        OneShot._n += 1
        path = self.home / f"in-{OneShot._n}.json"
        path.write_text(json.dumps(doc))
        return subprocess.Popen(
            [str(PLUGIN / f"{action}.sh"), "-f", str(path)],
            env=self.env,
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(self, proc: subprocess.Popen[str]) -> tuple[bool, dict[str, Any]]:
        out, err = proc.communicate(timeout=60)
        self.outputs += [out, err]
        body = json.loads(out)
        assert (proc.returncode == 0) == ("error" not in body), (proc.returncode, out)
        return proc.returncode == 0, body.get("error", body)

    def invoke(self, action: str, doc: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        return self.finish(self.start(action, doc))


class Persistent(PluginClient):
    """The ``provider`` executable: one process, one JSON line per request and per answer (one call at a time)."""

    def __init__(self, home: Path, config: Mapping[str, Any], cluster_tag: str) -> None:
        super().__init__(home, config, cluster_tag)
        self.stderr = open(home / "provider.stderr", "w")
        self.proc = subprocess.Popen(
            [str(PLUGIN / "provider")],
            env=self.env,
            cwd=home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self._id = 0

    def invoke(self, action: str, doc: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._id += 1
        self.proc.stdin.write(json.dumps({"id": self._id, "action": action, "input": doc}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        self.outputs.append(line)
        answer = json.loads(line)
        assert answer["id"] == self._id, answer
        return ("result" in answer), answer.get("result", answer.get("error"))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # EOF: the plugin finishes and exits
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.stderr.close()
        self.outputs.append((self.home / "provider.stderr").read_text())


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes (other than us) whose command line mentions ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in argv and state not in ("Z", "X"):
            found.append(int(name))
    return found


def secret_in_processes(secret: str) -> list[str]:
    """Where ``secret`` appears in any process's command line or environment (``ps`` shows both)."""
    hits = []
    needle = secret.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as f:
                    if needle in f.read():
                        hits.append(f"{name}/{part}")
            except OSError:
                continue
    return hits
