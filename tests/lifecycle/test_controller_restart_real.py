"""A controller restart returns no healthy machine (issue 31, finding 1), with real processes on the real clock.

``refcontroller serve`` (its own process, SQLite store) is stopped with SIGTERM and started again on the same
store and addresses while ``provisionerd run`` serves the local provider, whose machines are real ``provisionerd
agent`` processes. The machines are older than ``join_deadline`` (20 s) when the controller goes: its host table is
empty after the restart until the agents rejoin, which before the settle window read as "never joined" and
returned joined machines, busy ones included (2 of 3, 4 of 5 and 2 of 5 in three trials on the old planner).
"""

from __future__ import annotations

import pytest
import trio
from rigs import agents, procs, wait
from rigs.controller import ServedController
from rigs.daemon import Daemon, daemon_config, local_provider, make_certs, short_dir

from provisionerd.domain.model import DemandItem, ResourceShape

pytestmark = pytest.mark.process

MACHINES, JOIN_DEADLINE = 3, 20.0


def hosts_up(status: dict) -> set[str]:
    """The instance refs of the hosts the controller knows and does not call lost (a rejoined host may not have its
    machine id again until its fact is read: the ref is what it joined with)."""
    return {h["instance_ref"] for h in status["hosts"] if h["status"] != "lost"}


@pytest.mark.long  # the machines are made older than their join deadline on the real clock
def test_a_controller_restart_with_machines_older_than_join_deadline_returns_none(tmp_path) -> None:
    certs = make_certs(tmp_path)
    seen: dict = {}

    async def main() -> None:
        with short_dir("pd-ctlrst-") as state:
            async with procs.open_procs() as started:
                ctl = ServedController.at_free_ports(
                    certs, tmp_path / "ctl", started, args=("--lease-ttl", "6", "--check-interval", "0.5",
                                                            "--heartbeat-timeout", "5"),
                )  # fmt: skip
                await ctl.start()
                local = local_provider(tmp_path, certs, join_deadline=JOIN_DEADLINE, idle_time=3600.0)
                daemon = Daemon.write(daemon_config(certs, ctl.addresses, state, local), tmp_path / "pd.toml", started)
                await daemon.start()
                await daemon.wait_held(60)
                await ctl.admin.set_demand([DemandItem("d1", ResourceShape(ncpus=1), MACHINES)])

                async def joined() -> set[str] | None:
                    up = hosts_up(await ctl.admin.status())
                    return up if len(up) == MACHINES else None

                machines = await wait.until(f"{MACHINES} agents joined", joined, 60)
                joined_at = trio.current_time()
                # Older than the join deadline, with margin, before the controller goes.
                await trio.sleep(max(0.0, joined_at + JOIN_DEADLINE + 5 - trio.current_time()))
                await ctl.restart()
                restarted = trio.current_time()
                back = await wait.until(f"the {MACHINES} agents rejoined the restarted controller", joined, 60)
                seen["rejoined_after_s"] = trio.current_time() - restarted
                settled = await daemon.wait_status(
                    "the daemon's settle window closed", lambda s: s["providers"]["local"]["rejoin"]["settled"], 60
                )
                # The planner runs every replan interval at the latest: give it two passes past the window.
                await trio.sleep(1.0)
                seen.update(machines=machines, back=back, settled=settled["providers"]["local"]["rejoin"])
                seen["returns"] = [e for e in daemon.events("action") if e.get("kind") == "return"]
                seen["hosts_after"] = hosts_up(await ctl.admin.status())

    try:
        trio.run(main)
    finally:
        agents.kill_left(str(tmp_path))  # the machines: a daemon that stops keeps them
    assert seen["returns"] == [], seen["returns"]
    assert seen["back"] == seen["machines"] == seen["hosts_after"]
    assert seen["settled"]["missing"] == 0
    assert seen["rejoined_after_s"] < 30, seen["rejoined_after_s"]
