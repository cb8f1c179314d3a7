"""The third-party example on the plugin SDK alone (``providers/examples/python``) passes the conformance kit
(``provisionerd provider check``) over both transports."""

from __future__ import annotations

import ast
import json
import subprocess

import pytest
from plugintest_client import REPO
from rigs import pipes, procs

pytestmark = pytest.mark.process

EXAMPLE = REPO / "providers" / "examples" / "python"


def test_the_example_imports_nothing_of_provisionerd_but_the_sdk() -> None:
    tree = ast.parse((EXAMPLE / "example_plugin.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in modules if m and m.split(".")[0] == "provisionerd"}
    assert ours and all(m.startswith("provisionerd.plugin_sdk.") for m in ours), ours


@pytest.mark.parametrize("transport", ["persistent", "oneshot"])
def test_the_kit_passes_the_sdk_example(transport: str, tmp_path) -> None:
    run = pipes.piped(
        procs.provisionerd(
            "provider",
            "check",
            "--json",
            "--transport",
            transport,
            "--data-dir",
            tmp_path / "data",
            "--timeout",
            "20",
            EXAMPLE,
        ),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    rc, out, err = pipes.communicate(run, 180)
    summary = json.loads(out)
    failed = [c for c in summary["checks"] if not c["ok"]]
    assert (rc, failed) == (0, []), err.decode()[-2000:]
    assert summary["passed"] >= 15
    assert not list((tmp_path / "data" / "machines").iterdir())  # the kit returned every machine it asked for
