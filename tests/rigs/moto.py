"""The EC2 emulator (``moto_server``, from the ``moto[server]`` test extra) as a process for a test session.

It keeps its state in memory only, so one emulator serves a whole session: tests keep apart by their cluster names.
Started on a free loopback port and waited for until its own API answers; a moto that cannot start fails the
session's first test that needs it (moto is a pip dependency of the tests: never a skip).
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rigs import procs, wait

START_LIMIT = 30.0


def executable() -> Path:
    """``moto_server`` beside this interpreter (the venv the tests run in)."""
    return Path(sys.executable).with_name("moto_server")


@contextmanager
def moto_server(log: Path, limit: float = START_LIMIT) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a ``moto_server`` answering there (its output in ``log``); stopped at the end
    (``procs.popen``)."""
    exe = executable()
    if not exe.exists():
        pytest.fail(f"moto_server is not installed ({exe}): pip install 'moto[server]'")
    port = wait.free_port()
    url = f"http://127.0.0.1:{port}"
    with procs.popen([exe, "-H", "127.0.0.1", "-p", str(port)], log) as proc:

        def answers() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"moto_server exited with {proc.returncode}:\n{procs.tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=2):
                    return True
            except OSError:
                return False

        wait.blocking(f"moto_server answering on {url}", answers, limit)
        yield url
