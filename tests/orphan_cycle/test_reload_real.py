"""A SIGHUP that renames the provider, then an orphan dry run and an adopt through the admin socket, with real
processes (issue 15's done-when): both answer, the daemon stays up, the running config is unchanged.

The reference controller runs in this process on real mutual-TLS sockets; ``provisionerd run`` and the simulated
provider's plugin processes are real processes, on the real clock.
"""

from __future__ import annotations

import signal

import attrs
import pytest
import trio
from cycle_world import tags
from real_world import SECRET, real_world, sim
from rigs import wait
from test_admin_via_daemon import MATCH_ADOPT, STRAY_RETURN, match_host, plant_orphans

from provisionerd.daemon.admin_socket import request
from provisionerd.domain.model import OrphanAdopted

pytestmark = pytest.mark.process


def orphan(action: str, machine: str, provider: str = "sim", **extra) -> dict:
    return {"cmd": "orphan_action", "action": action, "provider": provider, "machine": machine, **extra}


def test_a_sighup_that_renames_the_provider_leaves_the_admin_path_answering(tmp_path, sock_dir):
    seen: dict = {}

    async def main():
        async with real_world(tmp_path, sock_dir, sim(tmp_path, dry_run=True)) as world:
            plant_orphans(world.data, ("i-stray", tags("op-stray")), ("i-match", tags("op-match")))
            match_host(world.ctl)
            daemon = world.daemon

            async def ask(document: dict) -> dict:
                return await trio.to_thread.run_sync(lambda: request(daemon.sock, document, timeout=60))

            proc = await daemon.start()
            held = await daemon.wait_held(60)
            seen["epoch"] = held["leases"][0]["epoch"]
            (provider,) = daemon.config.providers
            daemon.replace(attrs.evolve(daemon.config, providers=(attrs.evolve(provider, name="sim-renamed"),)))
            proc.process.send_signal(signal.SIGHUP)
            seen["after_hup"] = await daemon.wait_status("the reload reported", lambda s: s["reload"]["last"])
            seen["dry"] = await ask(orphan("return", "i-stray", dry_run=True, user="alice"))
            seen["adopt"] = await ask(orphan("adopt", "i-match", user="alice"))
            seen["renamed"] = await ask(orphan("return", "i-stray", provider="sim-renamed"))
            seen["garbage"] = await ask({"cmd": "orphan_action", "action": 7})
            renewals = len(daemon.events("lease_renewed"))
            await wait.until_sync(
                "a lease renewal after the requests", lambda: len(daemon.events("lease_renewed")) > renewals
            )
            seen["still"] = await daemon.wait_held(60)
            seen["alive"] = proc.running()
            seen["rc"] = await proc.stop(20)
            seen["log"] = proc.log.read_text()
            seen["facts"] = world.facts()
            seen["leases"] = world.ctl.server.cluster.leases.live_leases(trio.current_time())
            seen["events"] = daemon.events()
            seen["events_text"] = daemon.events_path.read_text()

    trio.run(main)
    log_text = seen["log"]
    assert seen["alive"] and seen["rc"] == 0, log_text[-3000:]
    reload = seen["after_hup"]["reload"]["last"]
    assert reload["outcome"] == "restart_needed" and reload["applied"] == []
    assert "providers (added ['sim-renamed'], removed ['sim'])" in reload["restart_needed"]
    assert "config_restart_needed fields=" in log_text and "sim-renamed" in log_text
    dry, adopt = seen["dry"], seen["adopt"]
    assert dry["ok"] and dry["result"]["outcome"] == "would" and dry["result"]["op_id"] == STRAY_RETURN, dry
    assert adopt["ok"] and adopt["result"]["op_id"] == MATCH_ADOPT and adopt["result"]["via"] == "daemon", adopt
    assert seen["renamed"]["refused"] == "unknown_provider"
    assert seen["garbage"]["refused"] == "bad_request"
    still = seen["still"]
    assert [lease["provider"] for lease in still["leases"]] == ["sim"]  # the running config: still "sim"
    assert still["leases"][0]["epoch"] == seen["epoch"]  # the same lease throughout: no restart, no re-grant
    assert still["admin"]["refusals"] == {"bad_request": 1, "unknown_provider": 1}
    assert [c.fact.machine_id for c in seen["facts"] if isinstance(c.fact, OrphanAdopted)] == ["i-match"]
    assert seen["leases"] == []  # released on SIGTERM
    (reloaded,) = [e for e in seen["events"] if e["event"] == "config_reloaded"]
    assert reloaded["outcome"] == "restart_needed"
    assert SECRET not in seen["events_text"] + log_text
