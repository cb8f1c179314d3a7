"""The sd_notify client against a real AF_UNIX datagram socket the test binds, and the watchdog on MockClock."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
import trio
import trio.testing

from provisionerd.daemon.systemd import SystemdNotify
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.sd_notify import SdNotifier, socket_address, watchdog_timeout


def receive_all(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


@pytest.fixture
def path_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setblocking(False)
    yield str(tmp_path / "notify"), sock
    sock.close()


def test_a_path_socket_receives_one_datagram_per_send(path_socket):
    path, sock = path_socket
    notifier = SdNotifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.enabled and notifier.watchdog is None
    try:
        assert notifier.send("READY=1", "STATUS=up")
        assert notifier.send("WATCHDOG=1")
        assert receive_all(sock) == ["READY=1\nSTATUS=up", "WATCHDOG=1"]
    finally:
        notifier.close()


def test_an_abstract_socket_is_addressed_with_a_leading_nul():
    name = f"provisionerd-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.setblocking(False)
    try:
        notifier = SdNotifier.from_env({"NOTIFY_SOCKET": f"@{name}"})
        assert notifier.send("READY=1")
        assert receive_all(sock) == ["READY=1"]
        notifier.close()
    finally:
        sock.close()


def test_without_notify_socket_nothing_is_sent():
    notifier = SdNotifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled and notifier.watchdog is None
    assert not notifier.send("READY=1")


def test_an_unsupported_address_disables_it_with_a_warning(caplog):
    notifier = SdNotifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not notifier.enabled
    assert "not a path or an abstract socket" in caplog.text


def test_a_vanished_receiver_drops_without_raising(tmp_path, caplog):
    notifier = SdNotifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not notifier.send("READY=1") and not notifier.send("WATCHDOG=1")
    notifier.close()
    assert notifier.dropped == 2
    assert caplog.text.count("systemd notification dropped") == 1  # one warning per kind of failure


def test_a_full_receiver_never_blocks_the_sender(path_socket):
    path, sock = path_socket
    notifier = SdNotifier(path)
    for _ in range(10_000):  # far past the receive queue: a blocking send would hang here
        if not notifier.send("WATCHDOG=1"):
            break
    notifier.close()
    assert notifier.dropped == 1 and notifier.sent > 0


def test_watchdog_usec_and_pid():
    assert watchdog_timeout({"WATCHDOG_USEC": "30000000"}, 42) == 30.0
    assert watchdog_timeout({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, 42) == 30.0
    assert watchdog_timeout({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, 42) is None  # another process's
    assert watchdog_timeout({"WATCHDOG_USEC": "0"}, 42) is None
    assert watchdog_timeout({"WATCHDOG_USEC": "soon"}, 42) is None
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@x") == b"\0x"
    assert socket_address("@") is None and socket_address("relative") is None


class Recording(SdNotifier):
    """Sends to the real socket, and notes the virtual time of each datagram."""

    def __init__(self, address: str, watchdog: float | None) -> None:
        super().__init__(address, watchdog=watchdog)
        self.at: list[tuple[float, str]] = []

    def send(self, *assignments: str) -> bool:
        sent = super().send(*assignments)
        if sent:
            self.at.append((trio.current_time(), "\n".join(assignments)))
        return sent


def test_watchdog_pings_at_half_the_timeout_only_while_the_loop_turns(path_socket):
    """WatchdogSec=20: a ping every 10 s while the loop's counter moves; once it has not been seen moving for
    stall_after (30 s), no more pings and one ``watchdog_stalled`` event; when it moves again, pings resume."""
    path, sock = path_socket
    notifier = Recording(path, watchdog=20.0)
    turns = [0]
    events = EventLog()
    notify = SystemdNotify(notifier, lambda: turns[0], lambda: f"turns {turns[0]}", events, stall_after=30.0)
    received: list[str] = []

    async def main():
        async with trio.open_nursery() as nursery:
            started = await nursery.start(notify.run)
            assert started is notify
            await trio.sleep(0.5)
            for t in range(200):  # the loop turns every second until 60, stops for 80 s, then turns again
                if t < 60 or t >= 140:
                    turns[0] += 1
                received.extend(receive_all(sock))  # as systemd does: the queue holds only a few datagrams
                await trio.sleep(1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    received.extend(receive_all(sock))
    assert received == [message for _, message in notifier.at]  # what was sent is what the socket got
    assert received[0] == "READY=1\nSTATUS=turns 0"
    pings = [t for t, message in notifier.at if "WATCHDOG=1" in message]
    # Ticks every 10 s; the last turn (59.5) is seen at the tick of 60: pings until 60 + 30, none from 100 to 140,
    # and again from the tick of 150, which sees the turns that restarted at 140.5.
    assert pings == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 150, 160, 170, 180, 190, 200]
    stalled = list(events.of_kind("watchdog_stalled"))
    assert len(stalled) == 1 and stalled[0]["idle"] == 40.0 and stalled[0]["stall_after"] == 30.0
    assert len(list(events.of_kind("watchdog_resumed"))) == 1
    assert "STATUS=turns 60\nWATCHDOG=1" in received  # STATUS= follows what the daemon reports, when it changes
    assert "STATUS=turns 60\nWATCHDOG=1" == received[7]


def test_not_under_systemd_the_task_returns_at_once():
    notify = SystemdNotify(SdNotifier(None), lambda: 0, lambda: "", EventLog(), stall_after=1.0)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(notify.run)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert notify.pings == 0


def test_stopping_is_sent(path_socket):
    path, sock = path_socket
    notify = SystemdNotify(SdNotifier(path), lambda: 0, lambda: "", EventLog(), stall_after=1.0)
    notify.stopping()
    notify.notifier.close()
    assert receive_all(sock) == ["STOPPING=1\nSTATUS=stopping: releasing leases"]
    assert os.path.exists(path)
