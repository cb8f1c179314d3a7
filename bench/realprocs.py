"""What the benches that run real processes share (``history.py``, ``steady.py``, ``wirecost.py``): a store
filled through the store API, the reference controller started on it as its own process (``python -m refcontroller
serve``, default flags; the tests' rig, ``tests/rigs``, starts and stops it), told apart from the bench by its
process id, and what ``/proc`` says a process has cost.

Importing this module puts ``tests`` on ``sys.path``, so that a bench run as ``python bench/X.py`` finds the rig.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from rigs import controller as serve  # noqa: E402
from rigs import procs, wait  # noqa: E402

from provisionerd.domain.model import Fact  # noqa: E402
from refcontroller.listeners import FACTS_FILE  # noqa: E402
from refcontroller.store import FactStore  # noqa: E402

__all__ = ["REPO", "controller", "cpu_seconds", "fill", "procs", "rss_mb", "serve", "token_hash", "wait"]


def token_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def fill(data: Path, facts: Iterable[Fact], holder: str, term: int = 0) -> tuple[int, float]:
    """Make the controller's store in ``data`` with ``facts`` (one transaction) and ``term``; (facts, seconds)."""
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    started = time.monotonic()
    store = FactStore.open(data / FACTS_FILE)
    try:
        if term:
            store.save_term(term)
        last = store.append_many(facts, holder)
    finally:
        store.close()
    return last, time.monotonic() - started


@contextlib.contextmanager
def controller(certs: Path, data: Path, *extra: str) -> Iterator[tuple[int, str]]:
    """The reference controller serving ``data`` on a free local port, its log beside ``data``: (its pid, its
    listen address)."""
    args = ["--certs", certs, "--data", data, "--listen", "127.0.0.1:0", "--log-level", "WARNING", *extra]
    with serve.running(args, data.parent / "controller.log") as running:
        yield running


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident set of process ``pid`` in MiB."""
    now = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return round(now, 1), round(peak, 1)
