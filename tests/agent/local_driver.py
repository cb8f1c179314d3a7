"""Drives providers/local through its real entry points: ``<action>.sh -f in.json`` or the persistent process."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

from rigs import pipes

from provisionerd.config.loader import ProviderConfig

PLUGIN = Path(__file__).resolve().parents[2] / "providers" / "local"
CLUSTER = "agenttest"


def local_conf(certs: Path, **extra: Any) -> dict[str, Any]:
    """The plugin's ``local.json``: its agents' certificates and quick timings (heartbeat 1 s, reply timeout 3 s,
    5 s from SIGTERM to SIGKILL); ``extra`` adds or replaces keys (``templates``)."""
    return {"certsDir": str(certs), "heartbeatSeconds": 1, "replyTimeoutSeconds": 3, "killGraceSeconds": 5, **extra}


def local_provider(home: Path, conf: dict[str, Any], **options: Any) -> ProviderConfig:
    """The daemon's config of this plugin: ``conf`` written to ``home/conf/local.json``, data in ``home/data``;
    ``options`` the rest of its ``[[providers]]`` table."""
    conf_dir, data_dir = home / "conf", home / "data"
    conf_dir.mkdir(exist_ok=True)
    data_dir.mkdir(exist_ok=True)
    (conf_dir / "local.json").write_text(json.dumps(conf))
    return ProviderConfig("local", "oneshot", path=PLUGIN, conf_dir=conf_dir, data_dir=data_dir, **options)


def plugin_env(tmp_path: Path, conf: dict[str, Any] | None = None, data: str = "data") -> dict[str, str]:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "local.json").write_text(json.dumps(conf or {}))
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/"),
        "PROVIDER_NAME": "local",
        "PRO_CONF_DIR": str(conf_dir),
        "PRO_DATA_DIR": str(tmp_path / data),
        "PROVISIONERD_CLUSTER": CLUSTER,
        "PROVISIONERD_PYTHON": sys.executable,
    }


class PluginFailed(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        self.code = error.get("code")
        self.error = error
        super().__init__(json.dumps(error))


class OneShot:
    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.outputs: list[str] = []  # every stdout, for the "no token comes back" checks

    def call(self, action: str, doc: dict[str, Any]) -> dict[str, Any]:
        path = self.workdir / "in.json"
        path.write_text(json.dumps(doc))
        path.chmod(0o600)
        process = pipes.piped([PLUGIN / f"{action}.sh", "-f", path], env=self.env, cwd=self.workdir, stdin=DEVNULL)
        rc, stdout, stderr = pipes.communicate(process, 120)
        assert rc is not None, f"{action} did not answer within 120 s"
        path.unlink()
        out = stdout.decode()
        self.outputs += [out, stderr.decode()]
        if rc != 0:
            raise PluginFailed(json.loads(out)["error"])
        return json.loads(out)


class Persistent:
    """The persistent plugin; ``close()`` ends it (EOF on stdin) and waits."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = pipes.piped([PLUGIN / "provider"], env=env)
        self.ids = itertools.count(1)
        self.outputs: list[str] = []

    def call(self, action: str, doc: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        ident = next(self.ids)
        self.process.stdin.write(json.dumps({"id": ident, "action": action, "input": doc}).encode() + b"\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline().decode()
        self.outputs.append(line)
        answer = json.loads(line)
        assert answer["id"] == ident
        if "error" in answer:
            raise PluginFailed(answer["error"])
        return answer["result"]

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        assert self.process.stderr is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                pipes.kill_group(self.process)
                self.process.wait()
            self.outputs.append(self.process.stderr.read().decode())
            self.process.stdout.close()
            self.process.stderr.close()


def owner_tags(op_id: str, cluster: str = CLUSTER) -> dict[str, str]:
    return {
        "provisionerd:cluster": cluster,
        "provisionerd:provider": "local",
        "provisionerd:op": op_id,
        "provisionerd:epoch": "1.1",
    }


def request_input(
    op_id: str, tokens: list[str], controllers: list[str], template: str = "local-1", cluster: str = CLUSTER
) -> dict[str, Any]:
    return {
        "template": {"templateId": template, "machineCount": len(tokens)},
        "op_id": op_id,
        "tags": owner_tags(op_id, cluster),
        "bootstrap": [
            {"instanceRef": f"{cluster}/{op_id}-{i}", "controllers": controllers, "joinToken": token}
            for i, token in enumerate(tokens)
        ],
    }


def return_input(op_id: str, machine_ids: list[str], cluster: str = CLUSTER) -> dict[str, Any]:
    return {
        "machines": [{"name": m, "machineId": m} for m in machine_ids],
        "op_id": op_id,
        "tags": owner_tags(op_id, cluster),
    }
