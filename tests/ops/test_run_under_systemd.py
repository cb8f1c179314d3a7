"""``provisionerd run --log-format json`` as a real process with ``NOTIFY_SOCKET`` set to a socket the test binds:
READY=1 with STATUS=, WATCHDOG=1 at half of WATCHDOG_USEC, STOPPING=1 on SIGTERM, exit 0; every stderr line is a
JSON object and no credential is in any of them. The controller is unreachable on purpose: READY=1 means the daemon
is up, not joined (daemon/systemd.py says why)."""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest
from rigs import agents, procs, wait
from rigs.daemon import daemon_config, make_certs, stub_plugin

from provisionerd.config.loader import Backoff, ProviderConfig
from provisionerd.config.writer import write_daemon_config

pytestmark = pytest.mark.process

SECRET = "do-not-leak-this-credential-42"


def test_ready_watchdog_stopping_and_json_logs(tmp_path):
    certs, state = make_certs(tmp_path, "c"), tmp_path / "state"
    # The plugin need not work (no demand), but its path must exist: a start proves it (config.proofs).
    sim = ProviderConfig("sim", "oneshot", path=stub_plugin(tmp_path), env={"SIM_SECRET": SECRET})
    link = {"connect_timeout": 1.0, "backoff": Backoff(initial=0.1, max=0.5)}
    nobody = f"127.0.0.1:{wait.free_port()}"
    config = write_daemon_config(
        daemon_config(certs, [nobody], state, sim, cluster="c", identity="prov-sd", link=link), tmp_path / "pd.toml"
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"}
    argv = procs.provisionerd("run", "--config", config.source, "--log-format", "json")
    messages: list[tuple[float, str]] = []

    def receive() -> None:
        message = notify.recv(4096).decode()
        messages.append((time.monotonic() - start, message))

    with notify, procs.popen(argv, tmp_path / "stderr", env=env) as proc:
        start = time.monotonic()
        while sum("WATCHDOG=1" in m for _, m in messages) < 3:
            receive()
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for _, m in messages):
            receive()
        rc = proc.wait(timeout=20)
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
    token = "SeCrEt-join-token-for-the-json-log-0123456789"
    certs = make_certs(tmp_path, "c")
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    log = tmp_path / "stderr"
    argv = agents.agent_argv(
        certs, ["127.0.0.1:9"], tmp_path, "--token-file", str(token_file), "--log-format", "json", ref="c/i-json"
    )
    with agents.agent(argv, log) as proc:
        wait.blocking("the agent's first join attempt", wait.log_has(log, "join via"), 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    text = log.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0]["message"].startswith("starting instance_ref='c/i-json'")
    assert all(r["pid"] == proc.pid and r["level"] in ("info", "warning") for r in records)
    assert any(r["message"].startswith("join via") for r in records)
    assert token not in text
