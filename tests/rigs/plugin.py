"""A provider plugin driven by a test over its own interface, as the daemon's runtime drives it: the same
environment (``PRO_CONF_DIR``, ``PRO_DATA_DIR``, ``PROVISIONERD_CLUSTER``...), its config file in the conf dir,
one-shot (``<action>.sh -f in.json``) or persistent (one JSON line per request and per answer, one call at a time).

The clients are synchronous: a plugin test reads like the calls it makes. A test under trio calls them through
``trio.to_thread.run_sync``. Every output the plugin printed is kept (``outputs``), so a test can prove that no
secret ever appeared in one. ``check`` runs the conformance kit (``provisionerd provider check``) against a plugin.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from provisionerd.config.loader import ProviderConfig
from rigs import procs, wait
from rigs.daemon import as_records

#: Nothing listens on the discard port: an agent pointed there just keeps retrying (enough for plugin tests).
NO_CONTROLLER = "127.0.0.1:9"


@attrs.frozen
class Plugin:
    """A shipped plugin: its directory, the name of its config file in the conf dir, the provider name it runs
    under, and how long its requests may take to settle on its back end."""

    path: Path
    conf_file: str
    provider: str
    settle_limit: float = 30.0

    def write_conf(self, conf_dir: Path, config: Mapping[str, Any]) -> Path:
        """``config`` as the plugin's config file in ``conf_dir`` (made if missing); returns ``conf_dir``."""
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / self.conf_file).write_text(json.dumps(config))
        return conf_dir

    def provider_config(
        self, home: Path, config: Mapping[str, Any], transport: str = "persistent", **options: Any
    ) -> ProviderConfig:
        """The daemon's ``[[providers]]`` entry for this plugin: ``config`` in ``home/<provider>-conf``, its data
        in ``home/<provider>-data``; ``options`` as ``ProviderConfig``'s (``max_machines``, ``timeouts``...; its
        machines are records: ``rigs.daemon.as_records``)."""
        conf_dir = self.write_conf(home / f"{self.provider}-conf", config)
        data_dir = home / f"{self.provider}-data"
        data_dir.mkdir(parents=True, exist_ok=True)
        return ProviderConfig(
            self.provider, transport, path=self.path, conf_dir=conf_dir, data_dir=data_dir, **as_records(options)
        )


class PluginClient:
    """The calls and the inputs a daemon would make; ``invoke`` (the transport) is the subclass's."""

    def __init__(self, plugin: Plugin, home: Path, config: Mapping[str, Any], cluster_tag: str) -> None:
        self.plugin = plugin
        self.provider = plugin.provider
        self.home = home
        self.conf_dir = plugin.write_conf(home / "conf", config)
        self.data_dir = home / "data"
        self.data_dir.mkdir(exist_ok=True)
        self.cluster_tag = cluster_tag
        self.tokens: list[str] = []
        self.outputs: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "PROVIDER_NAME": self.provider,
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
            "provisionerd:provider": self.provider,
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
        """A ``requestMachines`` input with fresh join tokens (kept in ``tokens``) unless ``tokens`` is given."""
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

    # --- calls -----------------------------------------------------------------------------------------------

    def status(self, request_id: str) -> dict[str, Any]:
        return self.call("getRequestStatus", {"requests": [{"requestId": request_id}]})["requests"][0]

    def settle(self, request_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The request's status once it is no longer ``running`` (within the plugin's ``settle_limit``)."""
        last: list[dict[str, Any]] = []

        def probe() -> dict[str, Any] | None:
            last[:] = [self.status(request_id)]
            return last[0] if last[0]["status"] != "running" else None

        limit = self.plugin.settle_limit if timeout is None else timeout
        try:
            return wait.blocking(f"request {request_id} to settle", probe, limit, interval=0.2)
        except wait.WaitTimeout as exc:
            raise wait.WaitTimeout(f"{exc}; last status: {last}") from None

    def listed(self, **tags: str) -> dict[str, dict[str, Any]]:
        """Our machines (the cluster tag and ``tags``) by machine id."""
        out = self.call("listMachines", {"tags": {"provisionerd:cluster": self.cluster_tag, **tags}})
        return {m["machineId"]: m for m in out["machines"]}

    def give_back(self, op_id: str, machines: list[dict[str, Any]]) -> dict[str, Any]:
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines]
        return self.call("requestReturnMachines", {"machines": refs, "op_id": op_id, "tags": self.owner(op_id)})


class OneShot(PluginClient):
    """``<action>.sh -f in.json``: exit 0 and a result, or exit 1 and an error document. ``start`` and ``finish``
    apart let a test run several calls at once."""

    _n = 0

    def start(self, action: str, doc: Mapping[str, Any]) -> subprocess.Popen[str]:
        OneShot._n += 1
        path = self.home / f"in-{OneShot._n}.json"
        path.write_text(json.dumps(doc))
        return subprocess.Popen(
            [str(self.plugin.path / f"{action}.sh"), "-f", str(path)],
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
    """The ``provider`` executable: one process, one JSON line per request and per answer (one call at a time),
    started at construction; ``close`` ends it with EOF on its stdin, as the daemon does."""

    def __init__(self, plugin: Plugin, home: Path, config: Mapping[str, Any], cluster_tag: str) -> None:
        super().__init__(plugin, home, config, cluster_tag)
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._id = 0
        self.start()

    def start(self) -> None:
        self._stderr = open(self.home / "provider.stderr", "a")
        self.proc = subprocess.Popen(
            [str(self.plugin.path / "provider")],
            env=self.env,
            cwd=self.home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._id = 0

    def send(self, action: str, doc: Mapping[str, Any]) -> None:
        """Write one request line (``invoke`` reads its answer; a test of a crash reads none)."""
        assert self.proc is not None and self.proc.stdin is not None
        self._id += 1
        self.proc.stdin.write(json.dumps({"id": self._id, "action": action, "input": doc}) + "\n")
        self.proc.stdin.flush()

    def invoke(self, action: str, doc: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        self.send(action, doc)
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.outputs.append(line)
        answer = json.loads(line)
        assert answer["id"] == self._id, answer
        return ("result" in answer), answer.get("result", answer.get("error"))

    def close(self) -> None:
        """EOF on stdin: the plugin finishes and exits (within 30 s); its stderr joins ``outputs``."""
        if self.proc is None:
            return
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it had exited already
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
        self.outputs.append((self.home / "provider.stderr").read_text())
        self.proc = None


def check(
    plugin: Plugin, conf_dir: Path, config: Mapping[str, Any], transport: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The conformance kit (``provisionerd provider check --json``) against ``plugin`` with ``config`` written to
    ``conf_dir``: the finished process and its JSON summary."""
    plugin.write_conf(conf_dir, config)
    argv = procs.provisionerd("provider", "check", "--transport", transport, "--json", "--conf-dir", conf_dir)
    done = procs.run([*argv, plugin.path], timeout=timeout)
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        message = f"provider check printed no summary (exit {done.returncode}): {done.stderr[-2000:]}"
        raise AssertionError(message) from None
    return done, summary
