"""`provisionerd run` as a real process against the reference controller as a real process (mutual TLS, real clock).

One scenario, because each process start costs a second or two: join through a standby's redirect, hold the lease
(visible through `provisionerd status`), survive a failover of the primary with a higher epoch, keep running on a
bad SIGHUP reload, and release the lease on SIGTERM.
"""

from __future__ import annotations

import signal

import attrs
import pytest
import trio
from rigs import procs
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir, stub_plugin

from provisionerd.cli import main as cli
from provisionerd.config.loader import LeaseSettings, ProviderConfig
from provisionerd.config.writer import daemon_config_toml
from provisionerd.domain.model import Epoch

pytestmark = pytest.mark.process


def test_run_status_failover_reload_and_sigterm(tmp_path):
    from refcontroller.api import open_refcontroller_process

    certs = make_certs(tmp_path)
    # The plugin need not work here (no demand), but its path must exist: a start proves it (config.proofs).
    sim = ProviderConfig("sim", "oneshot", path=stub_plugin(tmp_path), env={"SIM_SECRET": "do-not-leak-me"})
    seen: dict = {}

    async def main():
        with short_dir("pd-run-") as state:
            async with (
                open_refcontroller_process(
                    certs, tmp_path / "ctl", replicas=2, lease_ttl=2.0, check_interval=0.5, heartbeat_timeout=5.0
                ) as ctl,
                procs.open_procs() as started,
            ):
                spec = daemon_config(
                    certs,
                    (ctl.addresses[1], ctl.addresses[0]),
                    state,
                    sim,
                    identity="prov-real",
                    link={"request_timeout": 3.0, "heartbeat_timeout": 3.0},
                )
                daemon = Daemon.write(spec, tmp_path / "pd.toml", started)
                proc = await daemon.start()
                held = await daemon.wait_held()
                seen["first"] = held
                await ctl.fail_over()
                seen["second"] = await daemon.wait_status(
                    "the lease held again on the new primary, with a higher epoch",
                    lambda s: (
                        s["link"]["generation"] >= 2
                        and s["leases"][0]["state"] == "held"
                        and Epoch.parse(s["leases"][0]["epoch"]) > Epoch.parse(held["leases"][0]["epoch"])
                    ),
                )
                # A bad config on SIGHUP is reported and the running one kept (the writer would refuse to write it).
                daemon.path.write_text(daemon_config_toml(attrs.evolve(spec, lease=LeaseSettings(margin=-1))))
                proc.process.send_signal(signal.SIGHUP)
                await daemon.wait_event("config_reload_failed", 10)
                seen["after_hup"] = await daemon.wait_held()
                seen["controller_before"] = await ctl.status()
                seen["rc"] = await proc.stop(15)
                seen["controller_after"] = await ctl.status()
                seen["events"] = daemon.events()
                seen["everything"] = daemon.events_path.read_text() + proc.log.read_text()
                seen["sock_left"] = daemon.sock.exists()

    trio.run(main)
    assert seen["rc"] == 0
    first, second = seen["first"], seen["second"]
    assert first["link"]["state"] == "up" and first["identity"] == "prov-real"
    assert second["link"]["primary"] != first["link"]["primary"]
    assert second["link"]["term"] > first["link"]["term"]
    assert 0 < second["leases"][0]["remaining"] <= 1.5  # ttl 2 - margin 0.5
    assert [lease["provider"] for lease in seen["controller_before"]["leases"]] == ["sim"]
    assert seen["controller_after"]["leases"] == []  # released on SIGTERM
    events = seen["events"]
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
    assert "do-not-leak-me" not in seen["everything"]
    assert not seen["sock_left"]


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
