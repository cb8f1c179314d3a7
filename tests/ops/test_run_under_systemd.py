"""``provisionerd run --log-format json`` as a real process with ``NOTIFY_SOCKET`` set to a socket the test binds:
READY=1 with STATUS=, WATCHDOG=1 at half of WATCHDOG_USEC, STOPPING=1 on SIGTERM, exit 0; every stderr line is a
JSON object and no credential is in any of them. The controller is unreachable on purpose: READY=1 means the daemon
is up, not joined (daemon/systemd.py says why)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from provisionerd.config.loader import Backoff, Config, ControllerSettings, DaemonSettings, ProviderConfig
from provisionerd.config.writer import provisioner_tls, write_daemon_config

pytestmark = pytest.mark.process

SECRET = "do-not-leak-this-credential-42"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ready_watchdog_stopping_and_json_logs(tmp_path):
    from provisionerd.pki.certs import init_certs

    certs, state = tmp_path / "certs", tmp_path / "state"
    init_certs(certs, "c")
    config = tmp_path / "pd.toml"
    # The plugin need not work (no demand), but its path must exist: a start proves it (config.proofs).
    plugin = tmp_path / "plugins" / "sim"
    plugin.mkdir(parents=True)
    (plugin / "describeProvider.sh").write_text("#!/bin/sh\nexit 1\n")
    (plugin / "describeProvider.sh").chmod(0o755)
    write_daemon_config(
        Config(
            cluster="c",
            identity="prov-sd",
            controller=ControllerSettings(
                (f"127.0.0.1:{closed_port()}",), connect_timeout=1, backoff=Backoff(initial=0.1, max=0.5)
            ),
            tls=provisioner_tls(certs),
            daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
            providers=(ProviderConfig("sim", "oneshot", path=plugin, env={"SIM_SECRET": SECRET}),),
        ),
        config,
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"}
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "provisionerd", "run", "--config", str(config), "--log-format", "json"],
            env=env,
            stderr=stderr,
            start_new_session=True,
        )
    messages: list[tuple[float, str]] = []

    def receive() -> None:
        message = notify.recv(4096).decode()
        messages.append((time.monotonic() - start, message))

    try:
        start = time.monotonic()
        while sum("WATCHDOG=1" in m for _, m in messages) < 3:
            receive()
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for _, m in messages):
            receive()
        rc = proc.wait(timeout=20)
    finally:
        notify.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc == 0
    texts = [m for _, m in messages]
    assert texts[0].startswith("READY=1\nSTATUS=link ")  # the first datagram; the link is not up
    assert "leases 0/1 held" in texts[0]
    pings = [t for t, m in messages if "WATCHDOG=1" in m]
    gaps = [b - a for a, b in zip(pings, pings[1:], strict=False)]
    assert all(0.25 < gap < 1.0 for gap in gaps), gaps  # half of WATCHDOG_USEC (1 s), on a loaded real clock
    assert texts[-1].startswith("STOPPING=1")
    lines = (tmp_path / "stderr").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line one JSON object
    assert {"ts", "level", "logger", "message"} <= set(records[0])
    events = {r["event"] for r in records if "event" in r}
    assert {"daemon_started", "systemd_ready", "daemon_stopping", "daemon_stopped"} <= events
    started = next(r for r in records if r.get("event") == "daemon_started")
    assert started["identity"] == "prov-sd" and started["providers"] == ["sim"]
    assert SECRET not in "\n".join(lines) + (state / "events.jsonl").read_text()


def test_the_agent_logs_json_lines_without_its_token(tmp_path):
    """``provisionerd agent --log-format json`` (a worker): JSON lines with its pid, the join token in none."""
    from provisionerd.pki.certs import init_certs

    token = "SeCrEt-join-token-for-the-json-log-0123456789"
    init_certs(tmp_path / "certs", "c")
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    argv = [sys.executable, "-m", "provisionerd", "agent", "--certs", str(tmp_path / "certs"), "--controllers"]
    argv += ["127.0.0.1:9", "--instance-ref", "c/i-json", "--token-file", str(token_file), "--log-format", "json"]
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen(argv, stderr=stderr, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "join via" not in (tmp_path / "stderr").read_text():
            assert time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (tmp_path / "stderr").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0]["message"].startswith("starting instance_ref='c/i-json'")
    assert all(r["pid"] == proc.pid and r["level"] in ("info", "warning") for r in records)
    assert any(r["message"].startswith("join via") for r in records)
    assert token not in text
