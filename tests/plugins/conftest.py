"""Fixtures for the plugin tests; the client itself is ``plugintest_client.py`` (importable from test modules)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugintest_client import SCHEMAS, Contract, Persistent  # noqa: E402


@pytest.fixture(scope="session")
def contract() -> Contract:
    if not (SCHEMAS / "defs.json").exists():
        pytest.skip("schemas/ is not there yet")
    return Contract(SCHEMAS)


@pytest.fixture
def env(tmp_path: Path) -> dict:
    """The environment the daemon gives a plugin (LSF-like), with private conf and data directories."""
    conf, data, logs = tmp_path / "conf", tmp_path / "data", tmp_path / "logs"
    for d in (conf, data, logs):
        d.mkdir()
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PROVIDER_NAME": "test",
        "PRO_CONF_DIR": str(conf),
        "PRO_DATA_DIR": str(data),
        "PRO_LSF_LOGDIR": str(logs),
        "PRO_LSF_TOP": str(tmp_path),
        "PROVISIONERD_CLUSTER": "c1",
        # The interpreter running the tests; the plugins run it with -S (no site-packages), so this proves
        # nothing beyond the standard library is needed, without paying for the pyenv shim on every call.
        "PROVISIONERD_PYTHON": sys.executable,
    }


@pytest.fixture
def start_persistent():
    started: list[Persistent] = []

    def start(argv: list[str], env: dict) -> Persistent:
        p = Persistent([str(a) for a in argv], env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.cleanup()
