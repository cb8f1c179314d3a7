"""The agent starts on every machine (and many times in a test run): it does not import what only the daemon needs.

Its logs go through the same redaction as the daemon's (``telemetry.redaction``), which used to live in the
provider runtime and so brought in the plugin contract's schemas, jsonschema and the config loader with cattrs:
about a fifth of the agent's start-up CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # a fresh interpreter: this one has imported everything

DAEMON_ONLY = ("jsonschema", "cattrs", "provisionerd.config.loader", "provisionerd.provider.schemas")


def test_the_agent_command_imports_nothing_only_the_daemon_needs() -> None:
    probe = (
        "import json, sys\n"
        "from provisionerd.cli import agent\n"
        f"print(json.dumps(sorted(m for m in {DAEMON_ONLY!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
