"""Fixtures for the agent and local-provider tests: certificates, and the guarantee that no agent survives a test.

Every agent a test starts carries the test's ``tmp_path`` on its command line (its ``--certs`` directory or the
local provider's data-dir label), so ``no_leftover_agents`` can find any that outlived the test: it kills them and
fails the test.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: make agent_fakes/agent_procs importable

from rigs.agents import live_agents  # noqa: E402


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from provisionerd.pki.certs import init_certs

    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, "agentcluster")
    return directory


@pytest.fixture(autouse=True)
def no_leftover_agents(tmp_path: Path) -> Iterator[None]:
    yield
    survivors = live_agents(str(tmp_path))
    for pid in survivors:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not survivors, f"agent processes outlived the test: {survivors}"
