"""A SIGHUP that renames the provider, then an orphan dry run and an adopt through the admin socket, with real
processes (issue 15's done-when): both answer, the daemon stays up, the running config is unchanged.

The reference controller runs in this process on real mutual-TLS sockets; ``provisionerd run`` and the simulated
provider's plugin processes are real processes, on the real clock.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import sim_state
import trio
from cycle_world import tags
from test_admin_via_daemon import MATCH_ADOPT, STRAY_RETURN, short_socket_dir, write_real_config

from provisionerd.daemon.admin_socket import query, request
from provisionerd.domain.model import HostState, HostStatus, OrphanAdopted

pytestmark = pytest.mark.process


def test_a_sighup_that_renames_the_provider_leaves_the_admin_path_answering(tmp_path):
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller

    root = Path(__file__).resolve().parents[2]
    certs, data, config_path, state = tmp_path / "certs", tmp_path / "simdata", tmp_path / "pd.toml", short_socket_dir()
    init_certs(certs, "clu")
    launched = int(time.time()) - 60
    sim_state.plant_machine(data, "i-stray", tags("op-stray"), launched, n=1)
    sim_state.plant_machine(data, "i-match", tags("op-match"), launched, n=2)
    sock = state / "admin.sock"
    seen: dict = {}

    async def ask(document: dict) -> dict:
        return await trio.to_thread.run_sync(lambda: request(sock, document, timeout=60))

    async def poll_status(predicate):
        with trio.fail_after(60):
            while True:
                try:
                    reply = await trio.to_thread.run_sync(query, sock)
                except (OSError, ValueError):
                    reply = None
                if reply and reply.get("ok") and predicate(reply["status"]):
                    return reply["status"]
                await trio.sleep(0.1)

    def orphan(action: str, machine: str, provider: str = "sim", **extra) -> dict:
        return {"cmd": "orphan_action", "action": action, "provider": provider, "machine": machine, **extra}

    async def main():
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=5.0, check_interval=0.5) as ctl:
            cluster = ctl.server.cluster
            cluster.hosts.add(
                HostState("clu/op-match/0", "sim", "i-match", HostStatus.IDLE, time.time(), "node-match", "10.9.0.2")
            )
            write_real_config(config_path, certs, ctl.addresses, data, state)
            with open(tmp_path / "daemon.log", "wb") as log_file:  # noqa: ASYNC230 - the child's stderr needs a real file
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "provisionerd", "run", "--config", str(config_path)],
                    start_new_session=True,
                    stderr=log_file,
                    cwd=str(root),
                )
            try:
                held = await poll_status(lambda s: s["leases"][0]["state"] == "held")
                seen["epoch"] = held["leases"][0]["epoch"]
                text = config_path.read_text()
                config_path.write_text(text.replace('name = "sim"', 'name = "sim-renamed"'))
                proc.send_signal(signal.SIGHUP)
                seen["after_hup"] = await poll_status(lambda s: s["reload"]["last"] is not None)
                seen["dry"] = await ask(orphan("return", "i-stray", dry_run=True, user="alice"))
                seen["adopt"] = await ask(orphan("adopt", "i-match", user="alice"))
                seen["renamed"] = await ask(orphan("return", "i-stray", provider="sim-renamed"))
                seen["garbage"] = await ask({"cmd": "orphan_action", "action": 7})
                await trio.sleep(1.0)
                seen["still"] = await poll_status(lambda s: s["leases"][0]["state"] == "held")
                seen["alive"] = proc.returncode is None
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(20):
                    seen["rc"] = await proc.wait()
                seen["facts"] = list(cluster.store.all_facts())
                seen["leases"] = cluster.leases.live_leases(trio.current_time())
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()

    trio.run(main)
    log_text = (tmp_path / "daemon.log").read_text()
    assert seen["alive"] and seen["rc"] == 0, log_text[-3000:]
    reload = seen["after_hup"]["reload"]["last"]
    assert reload["outcome"] == "restart_needed" and reload["applied"] == []
    assert "providers (added ['sim-renamed'], removed ['sim'])" in reload["restart_needed"]
    assert "need a restart" in log_text and "sim-renamed" in log_text
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
    events = [json.loads(line) for line in (state / "events.jsonl").read_text().splitlines()]
    (reloaded,) = [e for e in events if e["event"] == "config_reloaded"]
    assert reloaded["outcome"] == "restart_needed"
    assert "do-not-leak-this-credential" not in (state / "events.jsonl").read_text() + log_text
