"""The demo tests' guarantee: whatever process a test leaves behind (one naming its ``tmp_path``) is killed, and
the test fails. Helpers live in ``demo_scan`` (importable: pytest runs in importlib mode)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from demo_scan import processes_naming  # noqa: E402


@pytest.fixture(autouse=True)
def nothing_left_behind(tmp_path: Path) -> Iterator[None]:
    yield
    survivors = processes_naming(str(tmp_path))
    for pid, _ in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert not survivors, f"processes outlived the test: {survivors}"
