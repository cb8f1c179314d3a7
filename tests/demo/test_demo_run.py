"""``provisionerd demo`` as a newcomer runs it: a real subprocess, real controller, daemon and agents."""

from __future__ import annotations

import json
import selectors
import signal
import time
from pathlib import Path

import pytest
from demo_scan import agents_naming, processes_naming, start_demo

pytestmark = pytest.mark.process

KEYS = ["ok", "requested", "joined", "returned", "failovers", "orphans_reported", "leaked", "seconds"]


def test_the_demo_at_the_default_size_reaches_ok_and_leaves_nothing_behind(tmp_path: Path) -> None:
    demo = start_demo(tmp_path, "--json")
    try:
        stdout, stderr = demo.communicate(timeout=120)
    finally:
        demo.kill()
    story = stderr.decode()
    assert demo.returncode == 0, story[-3000:]
    # --json: stdout holds the summary line and nothing else; its keys are exactly these, in this order.
    lines = stdout.decode().splitlines()
    assert len(lines) == 1, lines
    summary = json.loads(lines[-1])
    assert list(summary) == KEYS
    assert summary["ok"] is True
    assert summary["requested"] == summary["joined"] == summary["returned"] == 8  # the default N
    assert summary["failovers"] == 1 and summary["orphans_reported"] == 1 and summary["leaked"] == 0
    assert isinstance(summary["seconds"], float) and 0 < summary["seconds"] < 120
    # The story went to stderr as plain lines (not a terminal: no escape codes), every step in order.
    assert "\x1b[" not in story
    steps = [line for line in story.splitlines() if line.startswith("==> [")]
    assert [s.split("]")[0] for s in steps] == [f"==> [{i}/11" for i in range(1, 12)]
    assert "tagged_unknown" in story and "lease epoch 2." in story  # the orphan report; the lease in the new term
    assert "store: embedded (SQLite" in story  # it says it runs the embedded store, not etcd (issue 22 item 6)
    # Nothing of the run survives it: no agent, no daemon, no controller, no plugin, and no directory.
    assert agents_naming(str(tmp_path)) == []
    assert processes_naming(str(tmp_path)) == []
    assert list(tmp_path.glob("pd-demo-*")) == []


def read_until(demo, marker: str, limit: float) -> str:
    """Read the demo's stdout until a line contains ``marker``; everything read so far."""
    assert demo.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(demo.stdout, selectors.EVENT_READ)
    text = b""
    deadline = time.monotonic() + limit
    while marker.encode() not in text:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} within {limit}s: {text.decode()[-2000:]}"
        if selector.select(remaining):
            chunk = demo.stdout.read1(65536)
            assert chunk, f"the demo ended before {marker!r}: {text.decode()[-2000:]}"
            text += chunk
    return text.decode()


@pytest.mark.parametrize("signum", [signal.SIGINT], ids=["SIGINT"])
def test_an_interrupted_demo_stops_everything_and_fails(tmp_path: Path, signum: int) -> None:
    demo = start_demo(tmp_path, "--workers", "3")
    try:
        # Mid-run: the agents exist (demand is up) and the failover is next.
        read_until(demo, "==> [5/11]", limit=90)
        assert agents_naming(str(tmp_path)), "the workers should be running by now"
        demo.send_signal(signum)
        stdout, _ = demo.communicate(timeout=60)
    finally:
        demo.kill()
    assert demo.returncode == 128 + signum
    text = stdout.decode()
    assert f"interrupted by {signal.Signals(signum).name}" in text
    assert "FAILED in step" in text
    assert agents_naming(str(tmp_path)) == []
    assert processes_naming(str(tmp_path)) == []
    assert list(tmp_path.glob("pd-demo-*")) == []
