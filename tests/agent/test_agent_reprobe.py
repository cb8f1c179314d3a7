"""Health after join (issue 35 item 2, the agent's side): the probes run again every ``--reprobe-interval`` seconds
(``agent.reprobe``), and a report that differs from the last one sent reaches the controller once, in a
``WorkerStatus`` with ``capabilities`` and ``probedAt`` (protocol §6.4 "Health after join"). On MockClock with an
inline fake measure whose output flips, and once through the real probe runner in a thread."""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio
from agent_fakes import FakeController
from test_agent_shell import ADDRS, REF, TOKEN, NoJitter, on_mock_clock

from provisionerd.agent import capabilities, reprobe
from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.cli import agent as agent_cli
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import HostStatus
from provisionerd.wire.messages import WorkerStatus

JOINED = {"ngpus": "1"}
EPOCH = 1_700_000_000.0


class Flipping:
    """A machine whose GPU probe reports ``1``, then ``!exit 9`` from ``broken_from`` (virtual seconds), then ``1``
    again from ``fixed_from``; every measure is recorded at its virtual time."""

    def __init__(self, broken_from: float, fixed_from: float = float("inf")) -> None:
        self.broken_from, self.fixed_from = broken_from, fixed_from
        self.measured: list[float] = []

    def measure(self) -> Mapping[str, str]:
        now = trio.current_time()
        self.measured.append(now)
        return {"ngpus": "!exit 9" if self.broken_from <= now < self.fixed_from else "1"}


def wall() -> float:
    return EPOCH + trio.current_time()


def started(nursery: trio.Nursery, machine: Flipping) -> tuple[FakeController, WorkerAgent, reprobe.Reprobe]:
    fake = FakeController(nursery, ADDRS)
    fake.allow(REF, TOKEN)
    agent = WorkerAgent(AgentConfig(ADDRS, REF, capabilities=JOINED), TOKEN, fake.connect, rng=NoJitter())
    again = reprobe.Reprobe(
        machine.measure, agent.report_capabilities, 10.0, joined=JOINED, jitter=0.0, wall=wall, in_thread=False
    )
    nursery.start_soon(agent.run)
    nursery.start_soon(again.run)
    return fake, agent, again


@on_mock_clock
async def test_a_probe_that_starts_failing_is_reported_once_and_an_unchanged_one_is_not_resent() -> None:
    async with trio.open_nursery() as nursery:
        machine = Flipping(broken_from=15.0, fixed_from=45.0)
        fake, agent, again = started(nursery, machine)
        await trio.sleep(33)
        agent.set_status(HostStatus.BUSY)
        await trio.sleep(22)
        assert machine.measured == [10, 20, 30, 40, 50]
        assert [(t, r) for t, r in fake.reports] == [
            (0, WorkerStatus(HostStatus.IDLE)),
            (20, WorkerStatus(HostStatus.IDLE, capabilities={"ngpus": "!exit 9"}, probed_at=EPOCH + 20)),
            (33, WorkerStatus(HostStatus.BUSY)),  # the re-probe of 30 found the same: empty = unchanged
            (50, WorkerStatus(HostStatus.BUSY, capabilities={"ngpus": "1"}, probed_at=EPOCH + 50)),  # fixed
        ]
        assert (again.probes, again.changes) == (5, 2)
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_an_unchanged_machine_sends_nothing_but_its_status() -> None:
    async with trio.open_nursery() as nursery:
        machine = Flipping(broken_from=float("inf"))
        fake, _agent, again = started(nursery, machine)
        await trio.sleep(61)
        assert again.probes == 6 and again.changes == 0
        assert [r for _, r in fake.reports] == [WorkerStatus(HostStatus.IDLE)]
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_every_session_after_a_failover_reports_the_latest_reprobe_again_once() -> None:
    """The rejoin carries the join's own report, so the new session's first WorkerStatus repeats the re-probe."""
    async with trio.open_nursery() as nursery:
        machine = Flipping(broken_from=5.0)
        fake, agent, _again = started(nursery, machine)
        await trio.sleep(12)
        fake.fail_over()
        await trio.sleep(8)
        assert agent.joins == 2 and fake.received[-1].capabilities == JOINED
        probed = WorkerStatus(HostStatus.IDLE, capabilities={"ngpus": "!exit 9"}, probed_at=EPOCH + 10)
        rejoined = [t for t, _, what in fake.log if what.startswith("join")][-1]
        assert [(t, r) for t, r in fake.reports] == [
            (0, WorkerStatus(HostStatus.IDLE)),
            (10, probed),
            (rejoined, probed),
        ]
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_reprobe_before_the_first_join_goes_in_its_first_status() -> None:
    async with trio.open_nursery() as nursery:
        fake = FakeController(nursery, ADDRS)
        fake.allow(REF, TOKEN)
        agent = WorkerAgent(AgentConfig(ADDRS, REF, capabilities=JOINED), TOKEN, fake.connect, rng=NoJitter())
        agent.report_capabilities({"ngpus": "!timeout"}, EPOCH)
        nursery.start_soon(agent.run)
        await trio.sleep(1)
        assert [r for _, r in fake.reports] == [
            WorkerStatus(HostStatus.IDLE, capabilities={"ngpus": "!timeout"}, probed_at=EPOCH)
        ]
        nursery.cancel_scope.cancel()


def test_a_reprobe_report_needs_a_time_and_an_entry() -> None:
    agent = WorkerAgent(AgentConfig(ADDRS, REF), TOKEN, lambda _address: None)  # type: ignore[arg-type,return-value]
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="epoch seconds"):
            agent.report_capabilities({"ngpus": "1"}, bad)
    with pytest.raises(ValueError, match="not empty"):
        agent.report_capabilities({}, EPOCH)


def test_the_interval_is_jittered_within_a_tenth_and_must_be_positive() -> None:
    again = reprobe.Reprobe(dict, lambda _r, _t: None, 300.0, joined={}, rng=random.Random(35))
    delays = [again.next_delay() for _ in range(1000)]
    assert 270 <= min(delays) < 280 and 320 < max(delays) <= 330
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="interval"):
            reprobe.Reprobe(dict, lambda _r, _t: None, bad, joined={})
    with pytest.raises(ValueError, match="jitter"):
        reprobe.Reprobe(dict, lambda _r, _t: None, 10.0, joined={}, jitter=1.0)


@pytest.mark.process
def test_the_real_probes_run_in_a_thread_and_a_hung_one_reports_timeout(tmp_path: Path) -> None:
    """The probe runner itself (``capabilities.report``), off the event loop: a probe reading a file the test
    rewrites, and one that hangs past its timeout (``!timeout``, as at the join)."""
    state = tmp_path / "disk"
    state.write_text("rw\n")
    probes = {"disk": f"cat {state}", "slow": f"test -e {tmp_path / 'hang'} && sleep 30; echo ok"}
    measure = functools.partial(capabilities.report, probes, 0.5, host=False)
    sent: list[tuple[Mapping[str, str], float]] = []

    async def main() -> None:
        again = reprobe.Reprobe(measure, lambda r, t: sent.append((r, t)), 300.0, joined={"disk": "rw", "slow": "ok"})
        await again.probe()
        assert sent == []
        state.write_text("ro\n")
        (tmp_path / "hang").touch()
        await again.probe()
        await again.probe()
        assert [r for r, _ in sent] == [{"disk": "ro", "slow": "!timeout"}]
        assert (again.probes, again.changes) == (3, 1)

    trio.run(main)
    assert sent[0][1] > EPOCH  # wall-clock epoch seconds


def cli_args(tmp_path: Path, *extra: str) -> agent_cli.argparse.Namespace:
    base = ["--certs", str(tmp_path), "--controllers", "127.0.0.1:1", "--instance-ref", "r", "--token-stdin"]
    return agent_cli._parser().parse_args([*base, *extra])


def test_the_cli_takes_a_reprobe_interval_and_reprobes_only_what_it_measures(tmp_path: Path) -> None:
    assert cli_args(tmp_path).reprobe_interval == reprobe.DEFAULT_INTERVAL == 300
    for bad in ("5", "-1", "100000", "nan"):
        with pytest.raises(ConfigError, match="--reprobe-interval"):
            agent_cli._probes(cli_args(tmp_path, "--reprobe-interval", bad))
    agent = WorkerAgent(AgentConfig(ADDRS, REF), TOKEN, lambda _address: None)  # type: ignore[arg-type,return-value]
    probe = ["--probe", "ngpus=echo 1"]
    args = cli_args(tmp_path, *probe, "--reprobe-interval", "60")
    assert isinstance(agent_cli.reprobing(args, agent_cli._probes(args), JOINED, agent), reprobe.Reprobe)
    args = cli_args(tmp_path)  # the host's own entries, by default
    assert args.report_host and cli_args(tmp_path, "--report-host").report_host
    assert isinstance(agent_cli.reprobing(args, agent_cli._probes(args), JOINED, agent), reprobe.Reprobe)
    args = cli_args(tmp_path, *probe, "--reprobe-interval", "0")
    assert agent_cli.reprobing(args, agent_cli._probes(args), JOINED, agent) is None  # never
    args = cli_args(tmp_path, "--no-report-host")
    assert agent_cli.reprobing(args, agent_cli._probes(args), {}, agent) is None  # nothing to measure


def test_the_local_provider_takes_a_templates_reprobe_interval() -> None:
    """``reprobeInterval`` (providers/local/README.md), passed to the template's agents as ``--reprobe-interval``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "providers" / "local"))
    from localprovider.conf import _template

    from provisionerd.plugin_sdk.errors import PluginError

    doc = {"templateId": "gpu", "probes": {"ngpus": "cat /tmp/gpus"}}
    assert _template(doc, 0).reprobe_interval is None  # the agent's default
    assert _template({**doc, "reprobeInterval": 30}, 0).reprobe_interval == 30.0
    assert _template({**doc, "reprobeInterval": 0}, 0).reprobe_interval == 0.0
    for bad in (5, -1, 100000, True, "30"):
        with pytest.raises(PluginError, match="reprobeInterval"):
            _template({**doc, "reprobeInterval": bad}, 0)
