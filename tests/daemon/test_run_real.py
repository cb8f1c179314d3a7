"""`provisionerd run` as a real process against the reference controller as a real process (mutual TLS, real clock).

One scenario, because each process start costs a second or two: join through a standby's redirect, hold the lease
(visible through `provisionerd status`), survive a failover of the primary with a higher epoch, keep running on a
bad SIGHUP reload, and release the lease on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import attrs
import pytest
import trio

from provisionerd.cli import main as cli
from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    ProviderConfig,
)
from provisionerd.config.writer import daemon_config_toml, provisioner_tls, write_daemon_config
from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import Epoch

pytestmark = pytest.mark.process


def real_config(certs: Path, addresses, state: Path) -> Config:
    return Config(
        cluster="testcluster",
        identity="prov-real",
        controller=ControllerSettings(
            tuple(addresses),
            connect_timeout=3,
            request_timeout=3,
            heartbeat_interval=0.5,
            heartbeat_timeout=3,
            backoff=Backoff(initial=0.1, max=1),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
        providers=(ProviderConfig("sim", "oneshot", path=Path("plugins/sim"), env={"SIM_SECRET": "do-not-leak-me"}),),
    )


async def poll_status(sock: Path, predicate, limit: float = 30.0):
    with trio.fail_after(limit):
        while True:
            try:
                reply = await trio.to_thread.run_sync(query, sock)
            except (OSError, ValueError):
                reply = None
            if reply and reply.get("ok") and predicate(reply["status"]):
                return reply["status"]
            await trio.sleep(0.1)


def test_run_status_failover_reload_and_sigterm(tmp_path):
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller_process

    certs, state, config = tmp_path / "certs", tmp_path / "state", tmp_path / "pd.toml"
    init_certs(certs, "testcluster")
    # The plugin need not work here (no demand), but its path must exist: a start proves it (config.proofs).
    plugin = tmp_path / "plugins" / "sim"
    plugin.mkdir(parents=True)
    (plugin / "describeProvider.sh").write_text("#!/bin/sh\nexit 1\n")
    (plugin / "describeProvider.sh").chmod(0o755)
    seen: dict = {}

    async def main():
        async with open_refcontroller_process(
            certs, tmp_path / "ctl", replicas=2, lease_ttl=2.0, check_interval=0.5, heartbeat_timeout=5.0
        ) as ctl:
            spec = real_config(certs, (ctl.addresses[1], ctl.addresses[0]), state)
            write_daemon_config(spec, config)
            with open(tmp_path / "daemon.log", "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a real file
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "provisionerd", "run", "--config", str(config)],
                    start_new_session=True,
                    stderr=log_file,
                )
            try:
                sock = state / "admin.sock"
                held = await poll_status(sock, lambda s: s["leases"][0]["state"] == "held")
                seen["first"] = held
                await ctl.fail_over()
                moved = await poll_status(
                    sock,
                    lambda s: (
                        s["link"]["generation"] >= 2
                        and s["leases"][0]["state"] == "held"
                        and Epoch.parse(s["leases"][0]["epoch"]) > Epoch.parse(held["leases"][0]["epoch"])
                    ),
                )
                seen["second"] = moved
                # A bad config on SIGHUP is reported and the running one kept.
                config.write_text(daemon_config_toml(attrs.evolve(spec, lease=LeaseSettings(margin=-1))))
                proc.send_signal(signal.SIGHUP)
                await poll_status(sock, lambda s: True)
                with trio.fail_after(10):
                    while "config_reload_failed" not in (state / "events.jsonl").read_text():  # noqa: ASYNC110 - another process writes it
                        await trio.sleep(0.1)
                seen["after_hup"] = await poll_status(sock, lambda s: s["leases"][0]["state"] == "held")
                seen["controller_before"] = await ctl.status()
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    seen["rc"] = await proc.wait()
                seen["controller_after"] = await ctl.status()
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()

    trio.run(main)
    assert seen["rc"] == 0
    first, second = seen["first"], seen["second"]
    assert first["link"]["state"] == "up" and first["identity"] == "prov-real"
    assert second["link"]["primary"] != first["link"]["primary"]
    assert second["link"]["term"] > first["link"]["term"]
    assert 0 < second["leases"][0]["remaining"] <= 1.5  # ttl 2 - margin 0.5
    assert [lease["provider"] for lease in seen["controller_before"]["leases"]] == ["sim"]
    assert seen["controller_after"]["leases"] == []  # released on SIGTERM
    events = [json.loads(line) for line in (state / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    for kind in (
        "redirect",
        "join",
        "resync",
        "lease_acquired",
        "link_down",
        "lease_lost",
        "config_reload_failed",
        "daemon_stopping",
        "lease_released",
        "daemon_stopped",
    ):
        assert kind in kinds, kind
    assert kinds.index("redirect") < kinds.index("join")
    released = next(e for e in events if e["event"] == "lease_released")
    assert released["confirmed"] is True
    everything = (state / "events.jsonl").read_text() + (tmp_path / "daemon.log").read_text()
    assert "do-not-leak-me" not in everything
    assert not (state / "admin.sock").exists()


def test_run_refuses_a_bad_config_with_every_problem(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('cluster = "x"\n[controller]\naddresses = []\n')
    assert cli.main(["run", "--config", str(bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[1:] == [
        f"{bad}: controller.addresses: [] should be non-empty",
        f"{bad}: identity: is required but missing",
        f"{bad}: providers: is required but missing",
        f"{bad}: tls: is required but missing",
    ]
