"""Fixtures for the provider runtime tests: throwaway plugins built in tmp_path around tests/provider/plugins."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from provisionerd.provider.runtime import Limits, ProviderConfig
from provisionerd.provider.schemas import ACTIONS

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: make persistent_kit importable


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def oneshot_dir(root: Path, script: str, actions=ACTIONS) -> Path:
    """A one-shot plugin directory whose ``<action>.sh`` run ``plugins/<script>`` with the shared interpreter."""
    root.mkdir(parents=True, exist_ok=True)
    for action in actions:
        write_executable(
            root / f"{action}.sh",
            f'#!/bin/sh\nexec "$PROVISIONERD_PYTHON" -S {PLUGINS / script} oneshot {action} "$@"\n',
        )
    return root


def persistent_exe(root: Path, script: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return write_executable(
        root / "provider", f'#!/bin/sh\nexec "$PROVISIONERD_PYTHON" -S {PLUGINS / script} serve "$@"\n'
    )


def is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper (this container's pid 1 may not reap adopted orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def make_config(tmp_path: Path, data_dir: Path):
    def make(path: Path, transport: str = "oneshot", **kw) -> ProviderConfig:
        kw.setdefault("limits", Limits(term_grace=0.3, max_output=1 << 20, max_line=1 << 20))
        return ProviderConfig(
            name="test", cluster="c1", path=str(path), transport=transport, data_dir=str(data_dir), **kw
        )

    return make


def status_input(request_id: str) -> dict:
    return {"requests": [{"requestId": request_id}]}


class Helpers:
    """The helpers above, as a fixture: importlib mode makes conftest modules unimportable from tests."""

    write_executable = staticmethod(write_executable)
    oneshot_dir = staticmethod(oneshot_dir)
    persistent_exe = staticmethod(persistent_exe)
    is_dead = staticmethod(is_dead)
    status_input = staticmethod(status_input)


@pytest.fixture
def h() -> type[Helpers]:
    return Helpers


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plugin env is built from an allowlist; make sure a test never depends on the runner's variables.
    monkeypatch.delenv("SECRET_KEY", raising=False)
    os.environ.setdefault("PATH", "/usr/bin:/bin")


@pytest.fixture
def config(tmp_path: Path, make_config, h):
    """A persistent plugin running ``plugins/scripted.py`` (``test_persistent*.py``)."""
    return make_config(h.persistent_exe(tmp_path / "plugin", "scripted.py"), transport="persistent")
