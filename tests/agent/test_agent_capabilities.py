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
    probes = [arg for i in range(5) for arg in ("--probe", f"p{i}=echo {i}")]
    assert agent_cli.main([*base, *probes]) == agent_cli.EXIT_USAGE  # with the 4 built-ins: over the 8 kept
    assert "at most 4 probes" in capsys.readouterr().err
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


# --- the shipped GPU probe (issue 35 item 1), against a fake nvidia-smi ------------------------------------------


def _fake_nvidia_smi(bin_dir: Path, body: str) -> None:
    """An ``nvidia-smi`` on ``bin_dir`` that runs ``body`` (a shell script) and records its arguments."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\necho "$@" > "{bin_dir}/args"\n{body}\n')
    tool.chmod(0o755)


@pytest.mark.process
def test_the_gpu_probe_counts_the_gpus_the_runtime_answers_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    _fake_nvidia_smi(bin_dir, "printf 'NVIDIA A100-SXM4-40GB\\nNVIDIA A100-SXM4-40GB\\n'")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert capabilities.gpu_count(5) == "2"
    assert (bin_dir / "args").read_text().split() == ["--query-gpu=name", "--format=csv,noheader"]
    report = capabilities.report({}, 5)
    assert report["ngpus"] == "2" and {"ncpus", "mem", "type"} <= set(report)
    # A probe of the same name replaces the shipped one (another vendor's tool): nvidia-smi is not run.
    (bin_dir / "args").unlink()
    assert capabilities.report({"ngpus": "echo 4"}, 5)["ngpus"] == "4"
    assert not (bin_dir / "args").exists()
    # --no-report-host: nothing of the host, the GPUs included.
    assert capabilities.report({}, 5, host=False) == {}


@pytest.mark.process
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver'; exit 9", "!exit 9"),
        ("exec sleep 30", "!timeout"),
        ("true", "0"),  # the runtime answers, for no GPU
    ],
)
def test_a_gpu_runtime_that_does_not_answer_reports_no_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, expected: str
) -> None:
    _fake_nvidia_smi(tmp_path / "bin", body)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    started = time.monotonic()
    assert capabilities.gpu_count(0.5) == expected
    assert time.monotonic() - started < 5.0


def test_without_nvidia_smi_the_gpus_are_not_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not measured is not 0: the daemon says ``ngpus not reported`` of a GPU template's machine."""
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert capabilities.gpu_count(5) is None
    assert "ngpus" not in capabilities.report({}, 5)


def test_the_local_plugins_auto_template_is_what_its_agents_report() -> None:
    """An ``"auto"`` template of the local plugin declares this host as its agents measure it, so its machines pass
    the check that is now on by default (a cpuset narrower than the host would otherwise fail every one)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "providers" / "local"))
    from localprovider.conf import _template

    from provisionerd.domain.model import Offer
    from provisionerd.planner.health import capability_shortfall

    auto = _template({"templateId": "auto", "ncpus": "auto", "memMb": "auto", "type": "auto"}, 0)
    report = capabilities.built_in()
    assert (str(auto.ncpus), str(auto.mem_mb), auto.arch) == (report["ncpus"], report["mem"], report["type"])
    doc = auto.document(1)
    offer = Offer("local", "auto", 1, {k: (v[0], v[1]) for k, v in doc["attributes"].items()})
    assert capability_shortfall(offer, report) == ()
