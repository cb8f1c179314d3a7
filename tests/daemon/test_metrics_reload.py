"""A SIGHUP reload that changes ``[daemon] metrics_listen`` moves the metrics listener without a restart (#17 item 6):
the new address is bound after the switch, the old one closed; an address that cannot be bound leaves the listener
where it was, with an ERROR and ``metrics_listen_failed``. The real ``DaemonCore`` on MockClock (real loopback
listeners; a connect is only a kernel handshake, no HTTP exchange, so the clock's jumps do not matter)."""

from __future__ import annotations

import socket

import attrs
import trio
from rigs.memory import memory_core, running

from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider
from tests.daemon.test_observability import config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def with_metrics(cfg, address):
    return attrs.evolve(cfg, daemon=attrs.evolve(cfg.daemon, metrics_listen=address))


def test_a_reload_moves_the_metrics_listener_and_an_unusable_address_keeps_it(tmp_path, memory_controller, mock_run):
    first, second = free_port(), free_port()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = f"127.0.0.1:{busy.getsockname()[1]}"
    seen: dict = {}
    events = EventLog()

    async def main():
        async with memory_controller(replicas=1) as net:
            first_config = with_metrics(config(tmp_path, net.addresses), f"127.0.0.1:{first}")
            core = memory_core(net, first_config, FakeProvider("sim"), events=events)
            async with running(core):
                seen["start"] = (core.observability.address, accepts(first))
                seen["moved"] = core.reload(with_metrics(core.config, f"127.0.0.1:{second}")).outcome
                await trio.sleep(1)
                seen["after_move"] = (core.observability.address, accepts(first), accepts(second))
                seen["busy"] = core.reload(with_metrics(core.config, taken)).outcome
                await trio.sleep(1)
                seen["after_busy"] = (core.observability.address, accepts(second), core.config.daemon.metrics_listen)
                seen["off"] = core.reload(with_metrics(core.config, None)).outcome
                await trio.sleep(1)
                seen["after_off"] = (core.observability.address, accepts(second))

    try:
        mock_run(main)
    finally:
        busy.close()
    assert seen["start"] == (("127.0.0.1", first), True)
    assert seen["moved"] == "applied"  # a live field now, not restart_needed
    assert seen["after_move"] == (("127.0.0.1", second), False, True)
    assert seen["busy"] == "applied"
    address, still, named = seen["after_busy"]
    assert address == ("127.0.0.1", second) and still  # stayed where it was
    assert named == taken  # the config switched as a whole; only the bind failed, and says so
    (failed,) = events.of_kind("metrics_listen_failed")
    assert "daemon.metrics_listen" in failed["problems"][0]
    assert seen["off"] == "applied" and seen["after_off"] == (None, False)
