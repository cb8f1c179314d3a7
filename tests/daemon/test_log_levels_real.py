"""``log_level = "warning"`` on a real daemon (issue 32 item 4): a controller outage and a provider whose
credentials are refused both show, and nothing routine does.

``provisionerd run`` as a process against the reference controller as a process (mutual TLS, real clock), with a
one-shot plugin that answers every action with ``auth_failed``. The controller is stopped while the daemon runs:
the link goes down, the lease lapses, and every rejoin fails. The daemon's stderr (the human log, text) is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir

from provisionerd.config.loader import ProviderConfig
from provisionerd.domain.contract_actions import CONTRACT_ACTIONS

pytestmark = pytest.mark.process

REFUSED = json.dumps({"error": {"code": "auth_failed", "message": "the access key was refused"}})


def refusing_plugin(home: Path) -> Path:
    """Every action answers ``auth_failed`` (a typed error document on stdout, exit 1)."""
    plugin = home / "plugins" / "refusing"
    plugin.mkdir(parents=True)
    for action in CONTRACT_ACTIONS:
        script = plugin / f"{action}.sh"
        script.write_text(f"#!/bin/sh\necho '{REFUSED}'\nexit 1\n")
        script.chmod(0o755)
    return plugin


def test_at_warning_a_controller_outage_and_refused_credentials_are_in_the_log(tmp_path):
    from refcontroller.api import open_refcontroller_process

    certs = make_certs(tmp_path)
    provider = ProviderConfig("cloud", "oneshot", path=refusing_plugin(tmp_path))
    seen: dict = {}

    async def main():
        with short_dir("pd-warn-") as state:
            async with procs.open_procs() as started:
                async with open_refcontroller_process(
                    certs, tmp_path / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5, heartbeat_timeout=5.0
                ) as ctl:
                    spec = daemon_config(
                        certs,
                        ctl.addresses,
                        state,
                        provider,
                        identity="prov-warn",
                        link={"request_timeout": 2.0, "heartbeat_timeout": 2.0},
                        log_level="warning",
                    )
                    daemon = Daemon.write(spec, tmp_path / "pd.toml", started)
                    proc = await daemon.start()
                    await daemon.wait_held()
                    await daemon.wait_event("provider_unhealthy", 30)
                # The controller is gone: the link breaks, the lease lapses, rejoins fail.
                await daemon.wait_event("lease_lost", 30)
                await wait.until_sync(
                    "a failed rejoin in the daemon's log", lambda: "cannot join controller" in proc.log.read_text(), 30
                )
                seen["rc"] = await proc.stop(15)
                seen["log"] = proc.log.read_text()
                seen["events"] = [e["event"] for e in daemon.events()]

    trio.run(main)
    log = seen["log"]
    lines = log.splitlines()
    assert seen["rc"] == 0, log[-3000:]
    assert any(
        " WARNING provisionerd.events: provider_unhealthy provider=cloud code=auth_failed" in x for x in lines
    ), log
    assert any(" WARNING provisionerd.events: link_down " in x for x in lines), log
    assert any(" WARNING provisionerd.events: lease_lost provider=cloud " in x for x in lines), log
    assert any(" WARNING provisionerd.controller.session: cannot join controller at " in x for x in lines), log
    # Nothing routine at this level, though it happened (the events stream keeps everything).
    assert not [x for x in lines if " INFO " in x or " DEBUG " in x]
    assert {"lease_acquired", "join", "link_up", "daemon_started"} <= set(seen["events"])
    assert "None" not in log and "{'" not in log
