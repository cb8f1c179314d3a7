"""An idle fleet is quiet at INFO, and a fault still shows at WARNING (issue 32 item 4).

The real ``DaemonCore`` (session, two lease keepers, offer feed, orphan passes, reconcile loop) against the
reference controller over in-memory streams, on MockClock, for one virtual hour with nothing wanted. The daemon's
own stderr handler (``configure_logging`` with the collapse window, as ``provisionerd run`` sets it up) writes into
a buffer, on trio's clock, and the test counts its lines.
"""

from __future__ import annotations

import io
import logging

import pytest
import trio
import trio.testing
from rigs.memory import memory_config, memory_core, running

from provisionerd.config.loader import ProviderConfig
from provisionerd.domain.errors import AuthFailed
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.log_collapse import COLLAPSE_WINDOW
from provisionerd.telemetry.logging_setup import configure_logging
from provisionerd.testing.fake_provider import FakeProvider

HOUR = 3600.0
#: The controller's lease TTL (the reference controller's default): a renewal every TTL/3 per provider.
TTL = 30.0


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


class TrioClock:
    """trio's clock inside the run, the last value it gave after (the handler is closed after the run)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        try:
            self.last = trio.current_time()
        except RuntimeError:
            pass
        return self.last


def run_fleet(tmp_path, memory_controller, level: str, fault=None) -> tuple[list[str], EventLog]:
    """One virtual hour of a two-provider daemon; ``fault(net, providers)`` runs after ten minutes."""
    out = io.StringIO()
    clock = TrioClock()
    configure_logging(level, "text", stream=out, collapse=COLLAPSE_WINDOW, clock=clock, text_format="%(message)s")
    events = EventLog(keep=100_000)
    fakes = [FakeProvider(name, {"small": 10}) for name in ("alpha", "beta")]
    providers = [ProviderConfig(f.name, "oneshot", path=tmp_path / "plugins" / f.name) for f in fakes]

    async def main():
        async with memory_controller(replicas=1, ttl=TTL) as net:
            core = memory_core(net, memory_config(tmp_path, net.addresses, *providers), *fakes, events=events)
            async with running(core):
                await trio.sleep(600)
                if fault is not None:
                    await fault(net, fakes)
                await trio.sleep(HOUR - 600)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    configure_logging("warning", stream=io.StringIO())  # closes the handler: the counts it held are written
    return out.getvalue().splitlines(), events


def test_an_idle_two_provider_fleet_writes_under_100_lines_an_hour_at_info(tmp_path, memory_controller):
    lines, events = run_fleet(tmp_path, memory_controller, "info")
    renewed = sum(1 for _ in events.of_kind("lease_renewed"))
    assert renewed >= 2 * HOUR / (TTL / 3) * 0.9  # the leases were held and renewed all hour: the daemon was busy
    assert len(lines) < 100, "\n".join(lines)
    assert not any("lease_renewed" in line for line in lines)
    assert any(line.startswith("lease_acquired provider=alpha") for line in lines)
    assert not any("None" in line or "{'" in line for line in lines), lines


def test_at_warning_a_controller_outage_and_a_refused_credential_are_shown(tmp_path, memory_controller):
    async def outage_and_bad_credentials(net, fakes):
        net.partitioned = True
        await trio.sleep(60)
        net.partitioned = False
        await trio.sleep(60)  # rejoined, leases held again
        for _ in range(50):
            fakes[0].fail_next("getAvailableTemplates", AuthFailed("alpha", "getAvailableTemplates", "key refused"))

    lines, _ = run_fleet(tmp_path, memory_controller, "warning", outage_and_bad_credentials)
    text = "\n".join(lines)
    assert any(line.startswith("link_down ") for line in lines), text
    assert any(line.startswith("lease_lost provider=alpha") for line in lines), text
    assert any(line.startswith("cannot join controller at ") for line in lines), text
    assert any(line.startswith("provider_unhealthy provider=alpha code=auth_failed") for line in lines), text
    assert not any(line.startswith(("link_up", "lease_acquired", "daemon_started")) for line in lines), text
    # A minute of failed joins is a handful of lines, not one per attempt: the repeats are counted.
    assert sum(1 for line in lines if line.startswith("cannot join controller")) <= 6, text
