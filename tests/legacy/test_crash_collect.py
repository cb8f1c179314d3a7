"""kill -9 of ``provisionerd run`` during a legacy plugin's ``requestMachines``, then a restart (issue 19 item 1).

The plugin (the LSF example, unmodified) creates its machines and then sleeps before printing its requestId, so the
daemon dies while the call runs. The call runs on in its own session, its answer lands in its call directory under
the daemon's ``state_dir``; the restarted daemon collects it, polls the requestId as usual and tracks the machines:
no duplicate is created, and after demand 0 none is left. The reference controller runs in this process on real
mutual-TLS sockets; the daemons and plugin processes are real processes on the real clock.

Restarted either once the answer is in its call directory, or at once (issue 31, finding 2: the answer lands while
the new daemon starts and takes its lease; it was taken for an unknown outcome, the op failed and requested again,
and the machines the answer named leaked).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir
from rigs.facts import facts_of

from provisionerd.config.loader import LegacyOptions
from provisionerd.domain.model import DemandItem, InstanceFact, RequestFailed, RequestIntent, ResourceShape, Returned

pytestmark = pytest.mark.process


@pytest.mark.parametrize("restart", ["after_the_answer", "at_once"])
def test_a_daemon_killed_during_request_machines_tracks_the_machines_after_restart(world: Any, tmp_path, restart):
    from refcontroller.api import open_refcontroller

    certs = make_certs(tmp_path, "clu")
    # At once: the answer lands 1.5 s after the machines, while the new daemon waits for the lease (TTL 3 s) to
    # come free, so after its start-up collection and before its recovery asks about the op.
    slow = 3 if restart == "after_the_answer" else 1.5
    world.settings({"BOOT_POLLS": 1, "SLOW_REQUEST_SECONDS": slow, "SLOW_REQUEST_PHASE": "after_create"})
    seen: dict = {}

    async def main():
        with short_dir("pd-lgc-") as state:
            calls = state / "calls" / "lsfex"
            provider = world.daemon_provider(
                timeout=30,
                join_deadline=15,
                rejoin_settle=5,
                idle_time=1,
                legacy=LegacyOptions(journal=state / "lsfex.journal.json"),
            )
            async with (
                open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl,
                procs.open_procs() as started,
            ):

                def facts(kind):
                    return facts_of(ctl.server.cluster.store, kind)

                config = daemon_config(
                    certs, ctl.addresses, state, provider, cluster="clu", identity="prov-legacy-crash", state_dir=state
                )
                daemon = Daemon.write(config, tmp_path / "pd.toml", started)
                first = await daemon.start()
                await daemon.wait_held(60)
                await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=2), 2)])
                await wait.until_sync("the plugin made both machines", lambda: len(world.plugin_machines()) == 2, 60)
                # Made; the answer comes 3 s later.
                seen["call_dirs_at_kill"] = [p.name for p in calls.iterdir() if not p.name.startswith(".")]
                first.kill9()
                await first.wait()
                seen["instances_at_kill"] = len(facts(InstanceFact))
                seen["intents_at_kill"] = [(i.op_id, i.count) for i in facts(RequestIntent)]
                if restart == "after_the_answer":  # the call runs on without its daemon and leaves its answer
                    await wait.until_sync(
                        "the orphaned call's answer in its call directory",
                        lambda: any((p / "status").exists() for p in calls.iterdir()),
                        20,
                    )
                second = await daemon.start()
                await daemon.wait_held(60)
                await wait.until_sync("2 instance facts", lambda: len(facts(InstanceFact)) == 2, 60)
                seen["instances"] = facts(InstanceFact)
                seen["intents"] = [(i.op_id, i.count) for i in facts(RequestIntent)]
                seen["failed"] = facts(RequestFailed)
                await ctl.set_demand([])
                # Never joined: returned at the join deadline (15 s after launch) once the settle window after the
                # restart (rejoin_settle, 5 s here) has passed, and not replaced with demand 0.
                await wait.until_sync(
                    "both machines returned", lambda: sum(len(r.machine_ids) for r in facts(Returned)) >= 2, 60
                )
                await wait.until_sync(
                    "both machines terminated in the plugin's cloud",
                    lambda: all(m["status"] == "terminated" for m in world.plugin_machines().values()),
                    30,
                )
                seen["machines"] = world.plugin_machines()
                seen["intents_end"] = [(i.op_id, i.count) for i in facts(RequestIntent)]
                seen["calls_left"] = [p.name for p in calls.iterdir() if not p.name.startswith(".")]
                seen["rc"] = await second.stop(20)
                seen["log"] = second.log.read_text()

    trio.run(main)
    log2 = seen["log"]
    assert seen["rc"] == 0, log2[-3000:]
    assert len(seen["call_dirs_at_kill"]) == 1  # the requestMachines call, running
    assert seen["instances_at_kill"] == 0 and len(seen["intents_at_kill"]) == 1
    (old_op, count) = seen["intents_at_kill"][0]
    assert count == 2
    # Tracked from the collected answer: the old op's two machines, no new request, no failure.
    assert {f.op_id for f in seen["instances"]} == {old_op}
    assert seen["intents"] == seen["intents_at_kill"] and seen["failed"] == []
    assert seen["intents_end"] == seen["intents_at_kill"]
    # No duplicate was ever made, and none is left.
    assert len(seen["machines"]) == 2, seen["machines"]
    assert all(m["status"] == "terminated" for m in seen["machines"].values())
    assert seen["calls_left"] == []  # collected call directories are removed
    assert "tracked from the collected output" in log2
