"""Reloads of a real ``provisionerd run`` (issue 32 item 5), as systemd drives them: ``NOTIFY_SOCKET`` set to a
datagram socket the test binds, and ``provisionerd reload --socket`` (the shipped unit's ``ExecReload=``).

- A file that changes a restart-only key (``log_format``) with live keys (``log_level``, ``metrics_listen``, a
  provider's ``idle_time``): the live keys apply, ``log_format`` is named ``restart_needed``; the command exits 0.
- A file that does not load: the command exits 1 (so ``systemctl reload`` fails), the notify protocol brackets the
  reload with RELOADING=1 (and MONOTONIC_USEC) and READY=1 with ``ERRNO=22`` and ``STATUS=reload failed``; a
  SIGHUP does the same. While that file sits on disk, ``status --config``, ``orphans --dry-run --config`` and
  ``orphans return --socket`` still reach the running daemon through its admin socket.

The controller is unreachable on purpose: none of this needs a link.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import attrs
import pytest
from rigs import procs, wait
from rigs.daemon import daemon_config, make_certs, stub_plugin

from provisionerd.config.loader import Backoff, Config, ProviderConfig
from provisionerd.config.writer import write_daemon_config

pytestmark = pytest.mark.process


class Notify:
    """The fake ``NOTIFY_SOCKET``: every datagram the daemon sends, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(30)
        self.messages: list[dict[str, str]] = []

    def until(self, predicate, since: int = 0, limit: float = 30.0) -> int:
        """Receive until a message from index ``since`` on satisfies ``predicate``; its index."""
        deadline = time.monotonic() + limit
        for i in range(since, len(self.messages)):
            if predicate(self.messages[i]):
                return i
        while time.monotonic() < deadline:
            raw = self.sock.recv(65536).decode()
            self.messages.append(dict(line.split("=", 1) for line in raw.splitlines() if "=" in line))
            if predicate(self.messages[-1]):
                return len(self.messages) - 1
        raise AssertionError(f"no such notification in {self.messages}")


def start(tmp_path: Path) -> tuple[Config, dict[str, str]]:
    certs, state = make_certs(tmp_path, "c"), tmp_path / "state"
    sim = ProviderConfig("sim", "oneshot", path=stub_plugin(tmp_path))
    link = {"connect_timeout": 1.0, "backoff": Backoff(initial=0.2, max=1.0)}
    nobody = f"127.0.0.1:{wait.free_port()}"
    metrics = f"127.0.0.1:{wait.free_port()}"
    config = write_daemon_config(
        daemon_config(certs, [nobody], state, sim, cluster="c", identity="prov-rl", link=link, metrics_listen=metrics),
        tmp_path / "pd.toml",
    )
    return config, {"NOTIFY_SOCKET": str(tmp_path / "notify")}


def reload_cmd(socket_path: Path) -> list[str]:
    return procs.provisionerd("reload", "--socket", socket_path, "--json")


def test_a_reload_with_a_restart_only_key_applies_the_live_keys(tmp_path):
    config, env = start(tmp_path)
    sock = config.daemon.admin_socket
    assert sock is not None
    notify = Notify(tmp_path / "notify")
    argv = procs.provisionerd("run", "--config", config.source)
    with notify.sock, procs.popen(argv, tmp_path / "stderr", env=env) as proc:
        notify.until(lambda m: m.get("READY") == "1")
        moved = f"127.0.0.1:{wait.free_port()}"
        (provider,) = config.providers
        changed = attrs.evolve(
            config,
            daemon=attrs.evolve(config.daemon, log_format="json", log_level="debug", metrics_listen=moved),
            providers=(attrs.evolve(provider, idle_time=77.0),),
        )
        write_daemon_config(changed, Path(config.source))
        seen = len(notify.messages)
        done = procs.run(reload_cmd(sock), timeout=60)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["outcome"] == "applied"
        assert set(result["applied"]) == {"daemon.log_level", "daemon.metrics_listen", "providers.sim.idle_time"}
        assert result["restart_needed"] == ["daemon.log_format"]
        assert "needs a restart to take effect (the running value stays): daemon.log_format" in done.stderr
        host, port = moved.split(":")
        wait.blocking("the metrics listener at its new address", wait.accepts(host, int(port)), 20)
        status = json.loads(procs.run(procs.provisionerd("status", "--socket", sock, "--json")).stdout)
        assert status["reload"]["last"]["applied"] == result["applied"]
        reloading = notify.until(lambda m: m.get("RELOADING") == "1", seen)
        ready = notify.until(lambda m: m.get("READY") == "1", reloading)
        assert int(notify.messages[reloading]["MONOTONIC_USEC"]) > 0
        assert notify.messages[ready]["ERRNO"] == "0"
        assert "restart needed for: daemon.log_format" in notify.messages[ready]["STATUS"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    text = (tmp_path / "stderr").read_text()
    # log_format needs a restart: every line stays text; the new level (debug) is in force.
    assert not any(line.startswith("{") for line in text.splitlines())
    assert "config_restart_needed fields=" in text


def test_a_failed_reload_fails_the_command_and_the_notify_protocol_and_the_socket_still_answers(tmp_path):
    config, env = start(tmp_path)
    sock = config.daemon.admin_socket
    assert sock is not None
    notify = Notify(tmp_path / "notify")
    argv = procs.provisionerd("run", "--config", config.source)
    with notify.sock, procs.popen(argv, tmp_path / "stderr", env=env) as proc:
        notify.until(lambda m: m.get("READY") == "1")
        path = Path(config.source)
        path.write_text(path.read_text().replace("[daemon]\n", '[daemon]\nlog_level = "loud"\n'))
        seen = len(notify.messages)
        done = procs.run(reload_cmd(sock), timeout=60)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert json.loads(done.stdout)["outcome"] == "failed"
        assert "failed, the running config stays in force: daemon.log_level" in done.stderr
        reloading = notify.until(lambda m: m.get("RELOADING") == "1", seen)
        failed = notify.until(lambda m: m.get("READY") == "1", reloading)
        assert notify.messages[failed]["ERRNO"] == "22"
        assert notify.messages[failed]["STATUS"].startswith("reload failed, running config kept: daemon.log_level")

        # kill -HUP (outside systemctl) is the same reload, bracketed the same way.
        seen = len(notify.messages)
        proc.send_signal(signal.SIGHUP)
        reloading = notify.until(lambda m: m.get("RELOADING") == "1", seen)
        failed = notify.until(lambda m: m.get("READY") == "1", reloading)
        assert notify.messages[failed]["ERRNO"] == "22"

        # While the broken file is on disk: status and orphans reach the running daemon through its socket.
        status = procs.run(procs.provisionerd("status", "--config", path, "--json"))
        assert status.returncode in (0, 3), status.stderr  # answered (3: not ready, the controller is away)
        document = json.loads(status.stdout)
        assert document["reload"]["last"]["outcome"] == "failed" and document["reload"]["reloads"] == 2
        report = procs.run(
            procs.provisionerd("orphans", "--dry-run", "--config", path, "--json", "--timeout", "2"), timeout=90
        )
        assert "asking the running daemon at" in report.stderr, report.stderr
        assert "findings" in json.loads(report.stdout)
        assert "the controller's view could not be read" in report.stderr  # the report's own, as without a daemon
        action = procs.run(
            procs.provisionerd("orphans", "return", "--socket", sock, "--provider", "sim", "--machine", "i-x", "--json")
        )
        answered = json.loads(action.stdout)
        assert answered["via"] == "daemon", answered
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    text = (tmp_path / "stderr").read_text()
    assert text.count("config_reload_failed") == 2  # one line per failed reload, not two
