"""The demo's pure parts (counting, rendering, the summary line) and its failure path."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import attrs
import pytest
import trio
from demo_scan import processes_naming

from provisionerd.demo import cluster as demo_cluster
from provisionerd.demo import script as demo_script
from provisionerd.demo.cluster import DemoError
from provisionerd.demo.observe import EventsTail, EventTally, Snapshot, controller_fields, daemon_fields
from provisionerd.demo.procs import ProcInfo, parse_agent, start_child
from provisionerd.demo.progress import Progress, plain_line, status_lines
from provisionerd.demo.run import Summary, run_demo


def action(phase: str, kind: str, op_id: str, **fields) -> dict:
    return {"event": "action", "phase": phase, "kind": kind, "op_id": op_id, **fields}


def test_the_tally_counts_each_op_once_and_follows_returns() -> None:
    tally = EventTally()
    events = [
        action("planned", "request", "op1", count=5),  # planned only: not asked of the provider yet
        action("called", "request", "op1", count=5),
        action("called", "request", "op1", count=5),  # a retry with the same op_id asks for nothing new
        action("called", "request", "op2", count=3),
        action("called", "return", "r1", machines=4),
        action("result", "return", "r1", status="partial", machines=1),
        {"event": "lease_renewed", "provider": "local"},
        {"event": "action", "phase": "called", "kind": "request"},  # no op_id: ignored
    ]
    for event in events:
        tally.fold(event)
    assert (tally.total_requested, tally.total_returning, tally.total_returned) == (8, 3, 1)
    tally.fold(action("result", "return", "r1", status="returned", machines=4))
    tally.fold(action("result", "return", "r1", status="unknown", machines=0))  # not a confirmation
    assert (tally.total_returning, tally.total_returned) == (0, 4)


def test_the_events_tail_waits_for_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventsTail(path)
    assert tail.read_new() == []  # no file yet
    path.write_text('{"event": "a"}\n{"event": "b"')
    assert tail.read_new() == [{"event": "a"}]
    with path.open("a") as handle:
        handle.write("}\nnot json\n[1]\n")
    assert tail.read_new() == [{"event": "b"}]  # the rest of "b"; junk and non-objects skipped


def test_controller_and_daemon_fields() -> None:
    status = {
        "primary": 1,
        "term": 2,
        "replicas": [{"index": 0, "address": "a:1"}, {"index": 1, "address": "b:2"}],
        "hosts": [
            {"instance_ref": "w0", "status": "idle"},
            {"instance_ref": "w1", "status": "busy"},
            {"instance_ref": "w2", "status": "lost"},
            {"instance_ref": "w3", "status": "joined"},
            "junk",
        ],
        "sessions": [
            {"role": "worker", "replica": 1},
            {"role": "worker", "replica": 0},
            {"role": "provisioner", "replica": 1},
        ],
    }
    seen = {"w2"}  # joined earlier, lost since: still counts as joined once
    fields = controller_fields(status, seen)
    assert fields == {
        "idle": 1,
        "busy": 1,
        "live_hosts": 3,
        "primary": 1,
        "primary_address": "b:2",
        "term": 2,
        "workers_on_primary": 1,
    }
    assert seen == {"w0", "w1", "w2", "w3"}
    daemon = {
        "link": {"state": "up", "primary": "b:2"},
        "leases": [
            {"provider": "other", "state": "held", "epoch": "9.9"},
            {"provider": "local", "state": "held", "epoch": "2.1"},
        ],
    }
    assert daemon_fields(daemon, "local") == {"link": "up", "daemon_primary": "b:2", "lease": "held", "epoch": "2.1"}
    assert daemon_fields({}, "local") == {"link": "-", "daemon_primary": None, "lease": "-", "epoch": None}


def test_an_agent_is_known_by_its_command_line() -> None:
    argv = (
        "python",
        "-m",
        "provisionerd",
        "agent",
        "--certs",
        "/c",
        "--instance-ref",
        "c:op/0",
        "--machine-id",
        "local-1",
        "--label",
        "provisionerd:cluster=demo-x",
        "--label",
        "broken",
    )
    agent = parse_agent(ProcInfo(10, 99, argv))
    assert agent is not None
    assert (agent.machine_id, agent.instance_ref, agent.labels) == (
        "local-1",
        "c:op/0",
        {"provisionerd:cluster": "demo-x"},
    )
    assert parse_agent(ProcInfo(10, 99, ("python", "-m", "provisionerd", "agent", "--certs", "/c"))) is None
    assert parse_agent(ProcInfo(10, 99, ("bash", "--machine-id", "x"))) is None


SNAP = Snapshot(
    elapsed=3.25,
    step="step 5/11: failover",
    requested=8,
    joined=5,
    idle=4,
    busy=1,
    agents=9,
    epoch="2.1",
    lease="held",
    link="up",
    daemon_primary="127.0.0.1:2",
    primary=1,
    primary_address="127.0.0.1:2",
    term=2,
    workers_on_primary=5,
)


def test_the_status_block_and_the_plain_line_say_what_matters() -> None:
    block = "\n".join(status_lines(SNAP, 8))
    for text in (
        "requested 8/8",
        "joined 5",
        "idle 4",
        "returned 0",
        "primary #1 127.0.0.1:2",
        "term 2",
        "epoch 2.1",
        "link up",
    ):
        assert text in block
    assert "waiting" not in block
    assert "(waiting: the daemon's admin socket does not answer)" in "\n".join(
        status_lines(Snapshot(problem="the daemon's admin socket does not answer"), 8)
    )
    line = plain_line(SNAP)
    assert "\n" not in line and "epoch 2.1 (held)" in line and "primary #1 term 2" in line


def test_plain_output_prints_a_line_per_change_and_no_escape_codes() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False, workers=8)
    progress.update(SNAP)
    progress.say("==> [6/11] rejoin")
    progress.update(attrs.evolve(SNAP, elapsed=9.0))  # only the clock moved: nothing new to say
    progress.update(attrs.evolve(SNAP, joined=8, idle=8))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[1] == "==> [6/11] rejoin" and "joined 8" in lines[2]
    assert "\x1b" not in out.getvalue()


def test_a_terminal_gets_the_block_redrawn_in_place() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=True, workers=8)
    progress.update(SNAP)
    n = len(status_lines(SNAP, 8))
    progress.say("==> [6/11] rejoin")
    progress.update(attrs.evolve(SNAP, joined=8))
    progress.close()
    text = out.getvalue()
    # Each redraw first moves up over the block it drew and clears it; the permanent line stays above.
    assert text.count(f"\x1b[{n}F\x1b[J") == 2
    assert text.index("==> [6/11] rejoin") < text.rindex("joined 8")
    assert text.endswith("\n")


def test_the_json_line_has_exactly_the_promised_keys() -> None:
    ok = Summary(True, 8, 8, 8, 1, 1, 0, 14.2, steps=(("certificates", 0.1),))
    assert json.dumps(ok.document()) == (
        '{"ok": true, "requested": 8, "joined": 8, "returned": 8, "failovers": 1, '
        '"orphans_reported": 1, "leaked": 0, "seconds": 14.2}'
    )
    failed = Summary(False, 8, 3, 0, 0, 0, 0, 5.0, failed_step="failover", error="timed out after 38s")
    assert failed.document()["failed_step"] == "failover" and failed.document()["error"].startswith("timed out")


@pytest.mark.process
def test_a_failing_step_is_named_and_everything_is_cleaned_up(tmp_path: Path, monkeypatch) -> None:
    """The daemon exits at once: the demo fails in step 'daemon' saying so, and stops the controller it started."""

    async def broken_daemon(paths):
        argv = [sys.executable, "-c", "import sys; print('bad config, giving up', file=sys.stderr); sys.exit(3)"]
        return await start_child("daemon", argv, paths.logs / "daemon.log")

    monkeypatch.setattr(demo_cluster, "start_daemon", broken_daemon)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = io.StringIO()

    async def main() -> Summary:
        with trio.fail_after(90):
            return await run_demo(3, Progress(out, tty=False, workers=3), trio.CancelScope())

    summary = trio.run(main)
    assert not summary.ok and summary.failed_step == "daemon"
    assert "the daemon exited with 3" in summary.error and "bad config, giving up" in summary.error
    assert [name for name, _ in summary.steps] == ["certificates", "controller"]
    assert processes_naming(str(tmp_path)) == []  # the controller is gone
    assert list(tmp_path.glob("pd-demo-*")) == []
    assert "cleaning up after the failure in step 'daemon'" in out.getvalue()
    assert demo_script.step_timeouts(8)["rejoin"] > demo_script.step_timeouts(3)["rejoin"]  # bigger runs get longer


def test_bad_arguments_exit_2_before_anything_starts(capsys, tmp_path: Path, monkeypatch) -> None:
    from provisionerd.cli import demo as demo_cli

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert demo_cli.main(["--workers", "0"]) == 2
    assert demo_cli.main(["--workers", "many"]) == 2
    assert demo_cli.main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert "between 1 and 48, not 0" in err and "must be a whole number, not 'many'" in err
    assert list(tmp_path.iterdir()) == []  # nothing was made


@pytest.mark.process
def test_a_step_that_waits_on_workers_shows_the_end_of_their_logs(tmp_path: Path, monkeypatch) -> None:
    """Only the agents know why they did not rejoin the new primary (a fresh-clone CI run failed in 'rejoin' with
    nothing but the daemon's and the controller's logs): a failed step prints the end of each agent's log too."""

    async def no_rejoin(self) -> None:
        raise DemoError("rejoin", "forced by the test")

    monkeypatch.setattr(demo_script.DemoRun, "_rejoin", no_rejoin)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = io.StringIO()

    async def main() -> Summary:
        with trio.fail_after(120):
            return await run_demo(3, Progress(out, tty=False, workers=3), trio.CancelScope())

    summary = trio.run(main)
    assert not summary.ok and summary.failed_step == "rejoin"
    shown = [line for line in out.getvalue().splitlines() if line.startswith("--- the end of agent log local-")]
    assert len(shown) == 3, out.getvalue()[-3000:]
    assert processes_naming(str(tmp_path)) == []
