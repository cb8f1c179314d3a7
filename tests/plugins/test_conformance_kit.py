"""The conformance kit (``provisionerd provider check``) passes against our persistent plugins.

Both kit runs start at once (they are independent processes). The one-shot simulated provider and the bash example
take several seconds through the kit; ``test_contract.py`` runs the same contract against them directly.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from plugintest_client import NODE_EXAMPLE, REPO, SIMULATED
from rigs import pipes, procs

pytestmark = pytest.mark.process


def test_the_kit_passes_over_the_persistent_transport():
    pytest.importorskip("provisionerd.cli.provider")
    plugins = [SIMULATED] + ([NODE_EXAMPLE] if shutil.which("node") else [])
    runs = {
        plugin.name: pipes.piped(
            procs.provisionerd("provider", "check", "--json", "--transport", "persistent", "--timeout", "20", plugin),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        for plugin in plugins
    }
    for name, run in runs.items():
        rc, out, err = pipes.communicate(run, 120)
        summary = json.loads(out)
        failed = [c for c in summary["checks"] if not c["ok"]]
        assert (rc, failed) == (0, []), (name, err.decode()[-2000:])
        assert summary["passed"] >= 10, name
