"""Fixtures for the EC2 provider plugin: a real moto_server subprocess and the plugin as a real subprocess.

The emulator is started once per session on a free loopback port; a test that cannot start it fails (never skips).
Each test gets its own cluster name, so tests share the emulator without seeing each other's instances.
Every output the plugin writes (stdout and stderr, both transports) is recorded, and at teardown each test checks
that none of it contains the fake AWS secrets or any join token the test used.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import jsonschema
import pytest
import referencing
from rigs import procs
from rigs.moto import moto_server

sys.path.insert(0, str(Path(__file__).resolve().parent))  # importlib mode: make aws_fakes etc. importable
from aws_fakes import (  # noqa: E402
    ACCESS_KEY,
    IMAGE,
    PLUGIN_DIR,
    REGION,
    SCHEMAS,
    SECRET_KEY,
    SESSION_TOKEN,
    credentials_env,
    tags_of,
    user_data,
)

sys.path.insert(0, str(PLUGIN_DIR))

CALL_TIMEOUT = 60.0


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto_server started for this session (``rigs.moto``), stopped at teardown."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto_server.log") as url:
        yield url


@pytest.fixture(scope="session")
def ec2(moto_endpoint: str) -> Any:
    """A boto3 client on the emulator, for the tests' own setup and assertions."""
    return boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=moto_endpoint,
        aws_access_key_id="AKIATESTSIDE",
        aws_secret_access_key="test-side",
    )


class Schemas:
    """The contract's JSON Schemas from ``schemas/`` (written by the daemon side), built once."""

    def __init__(self) -> None:
        resources = []
        self._docs: dict[str, Any] = {}
        for path in SCHEMAS.glob("*.json"):
            doc = json.loads(path.read_text())
            self._docs[path.name] = doc
            resources.append((doc["$id"], referencing.Resource.from_contents(doc)))
        self._registry = referencing.Registry().with_resources(resources)
        self._validators: dict[str, Any] = {}

    def problems(self, name: str, doc: Any) -> list[str]:
        if name not in self._validators:
            schema = self._docs[name]
            self._validators[name] = jsonschema.validators.validator_for(schema)(schema, registry=self._registry)
        return [f"{e.json_path}: {e.message}" for e in self._validators[name].iter_errors(doc)]


@pytest.fixture(scope="session")
def schemas() -> Schemas:
    if not (SCHEMAS / "defs.json").exists():
        pytest.fail("schemas/ is missing: the contract schemas are needed to check the plugin's output")
    return Schemas()


class PluginRunner:
    """Runs the plugin as a subprocess with a per-test conf dir, data dir and cluster; records all output."""

    secrets = (ACCESS_KEY, SECRET_KEY, SESSION_TOKEN)
    plugin_dir = PLUGIN_DIR

    def __init__(self, tmp: Path, endpoint: str, schemas: Schemas) -> None:
        self.tmp = tmp
        self.cluster = f"cl-{uuid.uuid4().hex[:10]}"
        self.conf_dir = tmp / "conf"
        self.data_dir = tmp / "data"
        self.conf_dir.mkdir()
        self.data_dir.mkdir()
        self.call_log = tmp / "calls.jsonl"
        self.schemas = schemas
        self.outputs: list[str] = []
        self.tokens: list[str] = []
        self.config: dict[str, Any] = {
            "region": REGION,
            "endpoint_url": endpoint,
            "max_attempts": 1,
            "connect_timeout": 5,
            "read_timeout": 20,
            "templates": [
                {
                    "templateId": "c5-xlarge",
                    "instanceType": "c5.xlarge",
                    "imageId": IMAGE,
                    "maxNumber": 20,
                    "attributes": {"type": ["String", "X86_64"], "ncpus": ["Numeric", "4"], "mem": ["Numeric", "8192"]},
                }
            ],
            "fault_injection": {"call_log": str(self.call_log)},
        }
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp),
            "PRO_CONF_DIR": str(self.conf_dir),
            "PRO_DATA_DIR": str(self.data_dir),
            "PROVIDER_NAME": "aws",
            "PROVISIONERD_CLUSTER": self.cluster,
            "PROVISIONERD_PYTHON": sys.executable,
            **credentials_env(tmp),
        }
        self.write_config()

    # --- configuration ----------------------------------------------------------------------------------------

    def write_config(self, **changes: Any) -> None:
        self.config.update(changes)
        (self.conf_dir / "aws_ec2.json").write_text(json.dumps(self.config))

    def set_faults(self, *faults: dict[str, Any]) -> None:
        self.write_config(fault_injection={"call_log": str(self.call_log), "faults": list(faults)})

    def reset_calls(self) -> None:
        self.call_log.unlink(missing_ok=True)

    def calls(self, operation: str | None = None) -> list[dict[str, Any]]:
        if not self.call_log.exists():
            return []
        entries = [json.loads(line) for line in self.call_log.read_text().splitlines()]
        return [e for e in entries if operation is None or e["op"] == operation]

    # --- inputs -----------------------------------------------------------------------------------------------

    def owner_tags(self, op_id: str) -> dict[str, str]:
        return {
            "provisionerd:cluster": self.cluster,
            "provisionerd:provider": "aws",
            "provisionerd:op": op_id,
            "provisionerd:epoch": "3.7",
        }

    def request_input(self, op_id: str, count: int, template: str = "c5-xlarge") -> dict[str, Any]:
        boot = []
        for i in range(count):
            token = f"JOINTOKEN-{uuid.uuid4().hex}"
            self.tokens.append(token)
            boot.append({"instanceRef": f"{op_id}-m{i}", "controllers": ["ctl.example:7443"], "joinToken": token})
        return {
            "template": {"templateId": template, "machineCount": count},
            "op_id": op_id,
            "tags": self.owner_tags(op_id),
            "bootstrap": boot,
            "userData": {"site": "test"},
        }

    def return_input(self, op_id: str, ids: list[str]) -> dict[str, Any]:
        return {"machines": [{"name": i, "machineId": i} for i in ids], "op_id": op_id, "tags": self.owner_tags(op_id)}

    # --- one-shot transport -----------------------------------------------------------------------------------

    def oneshot(self, action: str, doc: dict[str, Any], env: dict[str, str] | None = None) -> tuple[int, Any]:
        """Run ``<action>.sh -f in.json``; returns ``(exit code, parsed stdout or None)``; checks the schema."""
        infile = self.tmp / f"in-{uuid.uuid4().hex[:8]}.json"
        infile.write_text(json.dumps(doc))
        workdir = self.tmp / "cwd"
        workdir.mkdir(exist_ok=True)
        argv = [PLUGIN_DIR / f"{action}.sh", "-f", infile]
        proc = procs.run_with_env(argv, env=env or self.env, cwd=workdir, timeout=CALL_TIMEOUT)
        stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
        self.outputs += [stdout, stderr]
        parsed = json.loads(stdout) if stdout.strip() else None
        if proc.returncode == 0:
            assert not self.schemas.problems(f"{action}.output.json", parsed), (action, parsed)
        elif parsed is not None:
            assert not self.schemas.problems("error.json", parsed), parsed
        return proc.returncode, parsed

    def ok(self, action: str, doc: dict[str, Any]) -> Any:
        rc, out = self.oneshot(action, doc)
        assert rc == 0, out
        return out

    def error(self, action: str, doc: dict[str, Any]) -> dict[str, Any]:
        rc, out = self.oneshot(action, doc)
        assert rc == 1 and out is not None, (rc, out)
        return out["error"]

    # --- persistent transport ---------------------------------------------------------------------------------

    def persistent(self, env: dict[str, str] | None = None) -> PersistentPlugin:
        return PersistentPlugin(self, env or self.env)

    # --- emulator side ----------------------------------------------------------------------------------------

    user_data = staticmethod(user_data)
    tags_of = staticmethod(tags_of)

    def instances(self, ec2: Any, **tags: str) -> list[dict[str, Any]]:
        wanted = {"provisionerd:cluster": self.cluster, **tags}
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in wanted.items()]
        return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


class PersistentPlugin:
    """The ``provider`` executable speaking JSON lines; every reply is checked against the schemas."""

    def __init__(self, runner: PluginRunner, env: dict[str, str]) -> None:
        self.runner = runner
        self.proc = procs.open_pipes([PLUGIN_DIR / "provider"], env=env, cwd=runner.tmp)
        self.next_id = 0
        self.pending: dict[int, str] = {}

    def send(self, action: str, doc: dict[str, Any]) -> int:
        self.next_id += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"id": self.next_id, "action": action, "input": doc}) + "\n").encode())
        self.proc.stdin.flush()
        self.pending[self.next_id] = action
        return self.next_id

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        self.runner.outputs.append(line)
        assert line, "the plugin closed stdout"
        reply = json.loads(line)
        action = self.pending.pop(reply["id"])
        if "result" in reply:
            assert not self.runner.schemas.problems(f"{action}.output.json", reply["result"]), reply
        else:
            assert not self.runner.schemas.problems("error.json", {"error": reply["error"]}), reply
        return reply

    def call(self, action: str, doc: dict[str, Any]) -> dict[str, Any]:
        request_id = self.send(action, doc)
        reply = self.receive()
        assert reply["id"] == request_id
        return reply

    def close(self) -> int:
        """EOF on stdin, then wait for the exit; idempotent. Returns the exit code."""
        assert self.proc.stdout is not None
        if self.proc.stdout.closed:
            return int(self.proc.returncode)
        code, rest, err = procs.close_pipes(self.proc, CALL_TIMEOUT)
        self.runner.outputs += [rest.decode(), err.decode()]
        return code

    def __enter__(self) -> PersistentPlugin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def plugin(tmp_path: Path, moto_endpoint: str, schemas: Schemas) -> Iterator[PluginRunner]:
    runner = PluginRunner(tmp_path, moto_endpoint, schemas)
    yield runner
    _check_leaks(runner)


def _check_leaks(runner: PluginRunner) -> None:
    leaked = [s for s in (*runner.secrets, *runner.tokens) if any(s in out for out in runner.outputs)]
    assert not leaked, f"secrets in plugin output: {leaked}"


@pytest.fixture(scope="module")
def shared_process(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, schemas: Schemas
) -> Iterator[tuple[PluginRunner, PersistentPlugin]]:
    """One persistent plugin for a module's tests that need no special config (a plugin start costs ~1 s of CPU).

    It runs without ``PROVISIONERD_CLUSTER``, so each test can use a cluster of its own in its owner tags.
    """
    runner = PluginRunner(tmp_path_factory.mktemp("shared"), moto_endpoint, schemas)
    del runner.env["PROVISIONERD_CLUSTER"]
    process = runner.persistent()
    yield runner, process
    assert process.close() == 0
    _check_leaks(runner)


@pytest.fixture
def shared(shared_process: tuple[PluginRunner, PersistentPlugin]) -> tuple[PluginRunner, PersistentPlugin]:
    """``(runner, process)``: the module's plugin process, with a fresh cluster name and an empty call log."""
    base, process = shared_process
    view = copy.copy(base)  # shares the output and token lists, so the module teardown checks them all
    view.cluster = f"cl-{uuid.uuid4().hex[:10]}"
    view.reset_calls()
    return view, process
