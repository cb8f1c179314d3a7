"""The agent's capability report (issue 20 item 1): built-in entries, probes from its own command line run with a
timeout and bounded output, and a join that carries the report."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from agent_fakes import FakeController

from provisionerd.agent import capabilities
from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.cli import agent as agent_cli


def test_the_built_in_report_names_this_machine() -> None:
    report = capabilities.built_in()
    assert set(report) == {"ncpus", "mem", "type"}
    assert int(report["ncpus"]) == len(os.sched_getaffinity(0))
    assert int(report["mem"]) > 0 and report["type"] == os.uname().machine.upper()


@pytest.mark.process
def test_a_probe_reports_the_first_line_it_prints_and_says_why_when_it_cannot() -> None:
    assert capabilities.run_probe("printf '2\\nmore\\n'", 5) == "2"
    assert capabilities.run_probe("echo '  1  ' | tr -d x", 5) == "1"
    assert capabilities.run_probe("exit 3", 5) == "!exit 3"
    assert capabilities.run_probe("true", 5) == "!empty"
    assert capabilities.run_probe("printf 'a\\tb'", 5) == "a?b"
    assert capabilities.run_probe("printf '%0100d' 0", 5) == "0" * capabilities.MAX_VALUE


@pytest.mark.process
def test_a_probe_that_hangs_is_killed_with_its_children_at_its_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    started = time.monotonic()
    value = capabilities.run_probe(f"sleep 30 & echo $! > {marker}; wait", 0.5)
    took = time.monotonic() - started
    assert value == "!timeout" and took < 5.0
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)  # the whole process group went, not only the shell


@pytest.mark.process
def test_a_probe_that_prints_without_end_costs_a_bounded_read() -> None:
    started = time.monotonic()
    assert capabilities.run_probe("yes 7", 5) == "7"
    assert time.monotonic() - started < 3.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ngpus", "NAME=COMMAND"),
        ("ngpus=  ", "NAME=COMMAND"),
        ("bad name=echo 1", "a probe name"),
        ("ncpus=echo 99", "reported by the agent itself"),
    ],
)
def test_a_bad_probe_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        capabilities.parse_probe(text)


def test_the_cli_takes_probes_and_refuses_too_many(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 32)
    token.chmod(0o600)
    base = ["--certs", str(tmp_path), "--controllers", "127.0.0.1:1", "--instance-ref", "r", "--token-file", str(token)]
    probes = [arg for i in range(6) for arg in ("--probe", f"p{i}=echo {i}")]
    assert agent_cli.main([*base, *probes]) == agent_cli.EXIT_USAGE
    assert "at most 5 probes" in capsys.readouterr().err
    assert agent_cli.main([*base, "--probe", "ngpus=echo 1", "--probe-timeout", "0"]) == agent_cli.EXIT_USAGE


def test_every_join_carries_the_report() -> None:
    """The report measured at start goes out with the first join and again with the rejoin after a failover."""
    report = {**capabilities.built_in(), "ngpus": "0"}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            fake = FakeController(nursery, ("a:1", "b:2"))
            fake.allow("ref-1", "t" * 32)
            config = AgentConfig(("a:1", "b:2"), "ref-1", capabilities=report)
            agent = WorkerAgent(config, "t" * 32, fake.connect)
            nursery.start_soon(agent.run)
            await trio.sleep(12)
            fake.fail_over()
            await trio.sleep(30)
            nursery.cancel_scope.cancel()
        assert len(fake.received) >= 2 and agent.joins >= 2
        assert all(dict(join.capabilities) == report for join in fake.received)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
