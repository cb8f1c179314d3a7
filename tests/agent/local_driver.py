"""Drives providers/local through its real entry points: ``<action>.sh -f in.json`` or the persistent process."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PLUGIN = Path(__file__).resolve().parents[2] / "providers" / "local"
CLUSTER = "agenttest"


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
        done = subprocess.run(
            [str(PLUGIN / f"{action}.sh"), "-f", str(path)],
            capture_output=True,
            env=self.env,
            cwd=self.workdir,
            timeout=120,
        )
        path.unlink()
        out = done.stdout.decode()
        self.outputs += [out, done.stderr.decode()]
        if done.returncode != 0:
            raise PluginFailed(json.loads(out)["error"])
        return json.loads(out)


class Persistent:
    """The persistent plugin; ``close()`` ends it (EOF on stdin) and waits."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [str(PLUGIN / "provider")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
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
                self.process.kill()
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
