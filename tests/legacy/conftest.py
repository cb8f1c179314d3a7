"""Fixtures for legacy mode: the LSF example plugin (providers/examples/lsf_legacy) behind the legacy adapter.

Each test gets its own conf dir (the example's templates plus a settings file it can rewrite between calls: the
plugin reads it on every call), data dir and adapter journal. PATH starts with the test interpreter's directory so
the plugin's ``python3`` is a real interpreter, not a slow version-manager shim.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from rigs import wait
from rigs.daemon import as_records

from provisionerd.config.loader import ProviderConfig as DaemonProvider
from provisionerd.config.loader import ProviderTimeouts
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.rules import UserDataTemplate
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import Limits, ProviderConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "providers" / "examples" / "lsf_legacy"
TEMPLATE = "lsfex-small"


def plugin_path() -> str:
    """The plugin's PATH: this interpreter's directory first, so its ``python3`` is a real interpreter."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])


class World:
    """One legacy plugin set-up: directories, the plugin's settings, adapters over it, and input builders."""

    def __init__(self, root: Path) -> None:
        self.conf = root / "conf"
        self.data = root / "data"
        self.journal = root / "journal.json"
        self.conf.mkdir()
        self.data.mkdir()
        shutil.copy(EXAMPLE / "conf" / "lsfexampleprov_templates.json", self.conf)
        self.tokens: dict[str, str] = {}  # instanceRef -> join token
        self.settings({})

    def settings(self, values: dict[str, Any]) -> None:
        """Rewrite the plugin's own settings file (LOG_INPUTS is always on: the tests read what it received)."""
        (self.conf / "lsfexampleprov_config.json").write_text(json.dumps({"LOG_INPUTS": True, **values}))

    def config(self, timeouts: dict[str, float] | None = None, calls_dir: str = "") -> ProviderConfig:
        return ProviderConfig(
            name="lsfex",
            cluster="c1",
            path=str(EXAMPLE),
            conf_dir=str(self.conf),
            data_dir=str(self.data),
            env={"PATH": plugin_path()},
            limits=Limits(term_grace=0.3),
            timeouts=timeouts or {},
            calls_dir=calls_dir,
        )

    def daemon_provider(self, timeout: float = 20.0, **options: Any) -> DaemonProvider:
        """The example as a provider in ``provisionerd run``'s config (``rigs.daemon.daemon_config``): the daemon
        detects the legacy mode (no ``describeProvider.sh``); ``options`` set the rest (``legacy``, deadlines)."""
        return DaemonProvider(
            "lsfex",
            "oneshot",
            path=EXAMPLE,
            conf_dir=self.conf,
            data_dir=self.data,
            **as_records(dict(env={"PATH": plugin_path()}, timeouts=ProviderTimeouts(default=timeout), **options)),
        )

    def adapter(
        self, user_data: dict[str, str] | None = None, timeouts: dict[str, float] | None = None, calls_dir: str = ""
    ) -> LegacyProvider:
        settings = LegacySettings(user_data=UserDataTemplate.parse(user_data or {}), journal_path=str(self.journal))
        return LegacyProvider(OneShotProvider(self.config(timeouts, calls_dir)), settings)

    def request(self, op_id: str, count: int, template: str = TEMPLATE) -> dict[str, Any]:
        boot = []
        for i in range(count):
            ref = f"{op_id}/i-{i}"
            self.tokens[ref] = secrets.token_urlsafe(24)
            boot.append({"instanceRef": ref, "controllers": ["10.0.0.5:7700"], "joinToken": self.tokens[ref]})
        return {
            "template": {"templateId": template, "machineCount": count},
            "rc_account": "default",
            "userData": {},
            "op_id": op_id,
            "tags": self.tags(op_id),
            "bootstrap": boot,
        }

    def tags(self, op_id: str) -> dict[str, str]:
        return {
            "provisionerd:cluster": "c1",
            "provisionerd:provider": "lsfex",
            "provisionerd:op": op_id,
            "provisionerd:epoch": "1.1",
        }

    def return_input(self, op_id: str, machines: list[dict[str, Any]]) -> dict[str, Any]:
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines]
        return {"machines": refs, "op_id": op_id, "tags": self.tags(op_id)}

    def inputs(self, action: str | None = None) -> list[tuple[str, str]]:
        """(action, raw text) of every input file the plugin received, in order."""
        folder = self.data / "inputs"
        if not folder.is_dir():
            return []
        found = []
        for path in sorted(folder.iterdir(), key=lambda p: int(p.name.split("-")[0])):
            name = path.name.rsplit("-", 1)[1].removesuffix(".json")
            if action is None or name == action:
                found.append((name, path.read_text()))
        return found

    async def wait_input(self, action: str, limit: float = 30.0) -> None:
        """Until the plugin has received an ``action`` input (``LOG_INPUTS``): that call is in flight."""
        await wait.until_sync(f"the plugin's {action} input", lambda: self.inputs(action), limit)

    def plugin_state(self) -> dict[str, Any]:
        return json.loads((self.data / "lsfexample-state.json").read_text())

    def plugin_machines(self) -> dict[str, Any]:
        """The plugin's machines by id ({} before its first call)."""
        path = self.data / "lsfexample-state.json"
        return json.loads(path.read_text())["machines"] if path.exists() else {}

    def user_data_of(self, machine_id: str) -> dict[str, str]:
        return json.loads((self.data / "userdata" / machine_id).read_text())


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def settle(client: Any, request_id: str, limit: float = 30.0) -> dict[str, Any]:
    """Poll getRequestStatus until ``request_id`` leaves ``running`` (real clock, generous limit)."""

    async def left_running() -> dict[str, Any] | None:
        out = await client.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
        (entry,) = out["requests"]
        return entry if entry["status"] != "running" else None

    return await wait.until(f"request {request_id} no longer running", left_running, limit)


class Helpers:
    settle = staticmethod(settle)


@pytest.fixture
def h() -> type[Helpers]:
    return Helpers
