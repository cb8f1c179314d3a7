"""The etcd store's client (httpx) is an extra: the embedded store, the demo's and the wheel's default, runs
without it, and asking for etcd without it is a clear refusal."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rigs import procs

pytestmark = pytest.mark.process

BLOCK_HTTPX = "import sys; sys.modules['httpx'] = None\n"


def run(code: str) -> subprocess.CompletedProcess[str]:
    return procs.run([sys.executable, "-c", BLOCK_HTTPX + code], timeout=60)


def test_the_refcontroller_cli_imports_without_httpx() -> None:
    done = run("import refcontroller.cli, refcontroller.listeners; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_an_etcd_store_without_httpx_is_refused_naming_the_extra(tmp_path) -> None:
    done = run(
        "import sys; from refcontroller.cli import main\n"
        f"sys.exit(main(['serve', '--certs', {str(tmp_path)!r}, '--listen', '127.0.0.1:0',"
        " '--store', 'etcd://127.0.0.1:2379']))"
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "provisionerd[etcd]" in done.stderr
