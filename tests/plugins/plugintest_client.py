"""A tiny test-local client for provider plugins, run as real subprocesses (no daemon code involved).

- ``oneshot(plugin_dir, action, input, env)``: writes ``in.json`` in a fresh working directory, runs
  ``<action>.sh -f in.json`` in its own session, and kills the whole group on timeout.
- ``Persistent``: starts the plugin's ``provider``, writes request lines, reads answer lines with a deadline.
- ``contract``: validates documents against ``schemas/`` (JSON Schema 2020-12, ``date-time`` checked).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import selectors
import subprocess
import time
from pathlib import Path

import attrs
import jsonschema
import referencing
from rigs import pipes

REPO = Path(__file__).resolve().parents[2]
SIMULATED = REPO / "providers" / "simulated"
BASH_EXAMPLE = REPO / "providers" / "examples" / "bash"
NODE_EXAMPLE = REPO / "providers" / "examples" / "node"
SCHEMAS = REPO / "schemas"
DEFAULT_SIM_CONFIG = json.loads((SIMULATED / "conf" / "simulated.json").read_text())


# ---- schemas -------------------------------------------------------------------------------------------------

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


class Contract:
    """Validators for every ``schemas/<action>.(input|output).json`` and ``error.json``, built once."""

    def __init__(self, directory: Path) -> None:
        docs = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
        registry = referencing.Registry().with_resources(
            (d["$id"], referencing.Resource.from_contents(d)) for d in docs
        )
        checker = jsonschema.FormatChecker()
        checker.checks("date-time")(lambda value: not isinstance(value, str) or bool(_RFC3339.match(value)))
        self._validators = {}
        for path, doc in zip(sorted(directory.glob("*.json")), docs, strict=True):
            cls = jsonschema.validators.validator_for(doc)
            self._validators[path.name.removesuffix(".json")] = cls(doc, registry=registry, format_checker=checker)

    def problems(self, name: str, document: object) -> list[str]:
        validator = self._validators[name]
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]

    def check_output(self, action: str, document: object) -> None:
        assert self.problems(f"{action}.output", document) == [], document

    def check_input(self, action: str, document: object) -> None:
        assert self.problems(f"{action}.input", document) == [], document

    def check_error(self, document: object) -> None:
        assert self.problems("error", document) == [], document


# ---- environment -------------------------------------------------------------------------------------------


def write_sim_config(env: dict, **changes) -> dict:
    """Write ``$PRO_CONF_DIR/simulated.json``: the shipped default with top-level keys replaced."""
    doc = copy.deepcopy(DEFAULT_SIM_CONFIG)
    doc.update(changes)
    Path(env["PRO_CONF_DIR"], "simulated.json").write_text(json.dumps(doc))
    return doc


# ---- inputs ------------------------------------------------------------------------------------------------

_tokens = itertools.count(1)


def owner_tags(op_id: str, cluster: str = "c1", provider: str = "test", epoch: str = "1.1") -> dict:
    return {
        "provisionerd:cluster": cluster,
        "provisionerd:provider": provider,
        "provisionerd:op": op_id,
        "provisionerd:epoch": epoch,
    }


def request_input(template: str, count: int, op_id: str, cluster: str = "c1") -> dict:
    return {
        "template": {"templateId": template, "machineCount": count},
        "rc_account": "default",
        "userData": {},
        "op_id": op_id,
        "tags": owner_tags(op_id, cluster),
        "bootstrap": [
            {
                "instanceRef": f"{cluster}/{op_id}/{i}",
                "controllers": ["10.0.0.1:7000"],
                "joinToken": f"JOINTOKEN-{next(_tokens):08d}-{op_id}-secret",
            }
            for i in range(count)
        ],
    }


def return_input(machines: list[dict], op_id: str, cluster: str = "c1") -> dict:
    return {
        "machines": [{"name": m["name"], "machineId": m["machineId"]} for m in machines],
        "op_id": op_id,
        "tags": owner_tags(op_id, cluster),
    }


# ---- one-shot transport -------------------------------------------------------------------------------------


@attrs.frozen
class Answer:
    rc: int | None  # None: killed on timeout
    stdout: bytes
    stderr: bytes

    @property
    def doc(self):
        return json.loads(self.stdout)


def oneshot(plugin_dir: Path, action: str, inp: object, env: dict, timeout: float = 20.0, workdir=None) -> Answer:
    """Run ``<plugin_dir>/<action>.sh -f in.json`` in its own session; on timeout kill the whole group."""
    work = Path(workdir or env["PRO_LSF_LOGDIR"]) / f"call-{time.monotonic_ns()}"
    work.mkdir()
    (work / "in.json").write_text(json.dumps(inp))
    proc = pipes.piped([plugin_dir / f"{action}.sh", "-f", "in.json"], env=env, cwd=work, stdin=subprocess.DEVNULL)
    return Answer(*pipes.communicate(proc, timeout))


def ok(plugin_dir: Path, action: str, inp: object, env: dict) -> dict:
    answer = oneshot(plugin_dir, action, inp, env)
    assert answer.rc == 0, (answer.stdout, answer.stderr)
    return answer.doc


# ---- persistent transport -----------------------------------------------------------------------------------


class Persistent:
    """A plugin process speaking JSON-lines; ``call`` sends one request and waits for its answer."""

    def __init__(self, argv: list[str], env: dict) -> None:
        self.proc = pipes.piped(argv, env=env, cwd=env["PRO_LSF_LOGDIR"])
        self._ids = itertools.count(1)
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.answers: dict[int, dict] = {}

    def send(self, action: str, inp: object, rid: int | None = None) -> int:
        rid = next(self._ids) if rid is None else rid
        self.send_raw(json.dumps({"id": rid, "action": action, "input": inp}).encode() + b"\n")
        return rid

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read_line(self, timeout: float = 10.0) -> bytes | None:
        """The next complete line; ``None`` at EOF or when nothing complete arrives within ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def read_rest(self, timeout: float = 10.0) -> bytes:
        """Everything up to EOF (for crash tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._sel.select(deadline - time.monotonic()):
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            self._buf += chunk
        rest, self._buf = self._buf, b""
        return rest

    def wait_for(self, rid: int, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while rid not in self.answers:
            line = self.read_line(max(0.0, deadline - time.monotonic()))
            assert line is not None, f"no answer to request {rid}"
            doc = json.loads(line)
            self.answers[doc["id"]] = doc
        return self.answers.pop(rid)

    def call(self, action: str, inp: object, timeout: float = 10.0) -> dict:
        return self.wait_for(self.send(action, inp), timeout)

    def result(self, action: str, inp: object) -> dict:
        answer = self.call(action, inp)
        assert "result" in answer, answer
        return answer["result"]

    def close(self) -> int:
        """Close stdin (EOF asks the plugin to exit) and wait; kill the group if it does not go."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        pipes.kill_group(self.proc)

    def cleanup(self) -> None:
        self.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except BrokenPipeError:
                pass
        self._sel.close()


# ---- one interface over both transports (for tests that run against every plugin) ---------------------------


class OneShotDriver:
    """``call(action, input) -> (ok, document)``: the result, or the inner error object on failure."""

    transport = "oneshot"

    def __init__(self, plugin_dir: Path, env: dict, contract) -> None:
        self.plugin_dir, self.env, self.contract = plugin_dir, env, contract
        self.transcript: list[bytes] = []

    def call(self, action: str, inp: object) -> tuple[bool, dict]:
        answer = oneshot(self.plugin_dir, action, inp, self.env)
        self.transcript += [answer.stdout, answer.stderr]
        doc = answer.doc
        if answer.rc == 0:
            self.contract.check_output(action, doc)
            return True, doc
        self.contract.check_error(doc)
        return False, doc["error"]


class PersistentDriver:
    transport = "persistent"

    def __init__(self, plugin: Persistent, contract) -> None:
        self.plugin, self.contract = plugin, contract
        self.transcript: list[bytes] = []

    def call(self, action: str, inp: object) -> tuple[bool, dict]:
        answer = self.plugin.call(action, inp)
        self.transcript.append(json.dumps(answer).encode())
        if "result" in answer:
            self.contract.check_output(action, answer["result"])
            return True, answer["result"]
        self.contract.check_error({"error": answer["error"]})
        return False, answer["error"]
