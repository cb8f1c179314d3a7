"""Every events record names the process start that wrote it (issue 22 item 5): two daemons appending to one events
file stay apart."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from provisionerd.telemetry.events import EventLog, ProcessInstance


def test_every_record_names_the_pid_and_a_random_instance_of_the_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    one, two = EventLog(path), EventLog(path)  # two starts on one file
    one.emit("daemon_started", identity="x")
    two.emit("daemon_started", identity="x")
    one.emit("lease_acquired", provider="p")
    one.close()
    two.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["process"]["pid"] for r in records] == [os.getpid()] * 3
    instances = [r["process"]["instance"] for r in records]
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in instances)
    assert instances[0] == instances[2] != instances[1]
    assert records[0]["event"] == "daemon_started" and records[0]["identity"] == "x"


def test_the_instance_can_be_named_after_the_join() -> None:
    events = EventLog(process=ProcessInstance.current("abcd"))
    assert events.emit("x")["process"] == {"pid": os.getpid(), "instance": "abcd"}
