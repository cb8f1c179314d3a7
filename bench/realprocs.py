"""What the benches that run real processes share (``history.py``, ``steady.py``): a store filled through the store
API, and the reference controller started on it as its own process (``python -m refcontroller serve``, default
flags), told apart from the bench by its process id."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from provisionerd.domain.model import Fact
from refcontroller.listeners import FACTS_FILE
from refcontroller.store import FactStore


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
def controller(certs: Path, data: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The reference controller serving ``data`` on a free local port: (process, its listen address)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "refcontroller", "serve", "--certs", str(certs), "--data", str(data)]
        + ["--listen", "127.0.0.1:0", "--log-level", "WARNING", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        yield proc, ready["listen"][0]
    finally:
        proc.terminate()
        proc.wait(30)


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
