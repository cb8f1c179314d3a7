"""The conformance kit (``provisionerd provider check``) passes against our persistent plugins.

Both kit runs start at once (they are independent processes). The one-shot simulated provider and the bash example
take several seconds through the kit; ``test_contract.py`` runs the same contract against them directly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from plugintest_client import NODE_EXAMPLE, REPO, SIMULATED

pytestmark = pytest.mark.process


def test_the_kit_passes_over_the_persistent_transport():
    pytest.importorskip("provisionerd.cli.provider")
    plugins = [SIMULATED] + ([NODE_EXAMPLE] if shutil.which("node") else [])
    runs = {
        plugin.name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "provisionerd",
                "provider",
                "check",
                "--json",
                "--transport",
                "persistent",
                "--timeout",
                "20",
                str(plugin),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for plugin in plugins
    }
    for name, run in runs.items():
        out, err = run.communicate(timeout=120)
        summary = json.loads(out)
        failed = [c for c in summary["checks"] if not c["ok"]]
        assert (run.returncode, failed) == (0, []), (name, err.decode()[-2000:])
        assert summary["passed"] >= 10, name
