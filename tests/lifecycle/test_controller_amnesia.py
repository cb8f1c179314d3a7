"""A daemon whose controller comes back with a fresh store: no provider call and every machine kept until the admin
accepts the reset, then the lifecycle resumes (real clock: the reference controller on real TLS sockets in this
process, the daemon core, the simulated provider as a real persistent plugin, the admin socket and the CLI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import wait
from rigs.core import daemon_core, record, running
from rigs.daemon import make_certs, short_dir
from rigs.facts import facts_of
from sim_daemon import CLUSTER, sim_config

from provisionerd.cli import main as cli
from provisionerd.controller.session_settings import LinkState
from provisionerd.daemon.admin_socket import query
from provisionerd.domain.model import TAG_CLUSTER, DemandItem, InstanceFact, ResourceShape
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy

pytestmark = pytest.mark.process

MUTATIONS = {"requestMachines", "returnMachines", "terminateMachines"}


def test_a_controller_restarted_on_a_fresh_store_gets_no_mutation_until_accept_reset(tmp_path: Path) -> None:
    from refcontroller.listeners import ServeConfig, serve

    certs = make_certs(tmp_path, CLUSTER)
    address = f"127.0.0.1:{wait.free_port()}"

    async def main(state: Path) -> None:
        config = sim_config(tmp_path, certs, (address,), state, identity="prov-amnesia")
        sock = config.daemon.admin_socket
        recorded = record(config, "sim")
        core = daemon_core(
            config,
            policy=Policy(cluster=CLUSTER, idle_time=600.0, join_deadline=600.0, provisioning_timeout=60.0),
            loop=LoopSettings(replan_interval=0.3, reclaim_interval=5.0, recover_after=10.0),
            recorded=recorded,
        )

        def serve_config(data: Path) -> ServeConfig:
            return ServeConfig(certs_dir=certs, data_dir=data, listen=(address,), lease_ttl=2.0, check_interval=0.3)

        async def listing() -> list[dict[str, Any]]:
            answer = await recorded.inner.call("listMachines", {"tags": {TAG_CLUSTER: CLUSTER}})
            return list(answer["machines"])

        def instances(cluster: Any) -> int:
            return len(facts_of(cluster.store, InstanceFact))

        async with running(core, recorded.inner, release=0.5):
            async with trio.open_nursery() as first:  # controller A: two machines, their facts acknowledged
                running_a = await first.start(serve, serve_config(tmp_path / "ctl-a"))
                cluster_a = running_a.server.cluster
                cluster_a.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
                await wait.until_sync("2 instance facts on controller A", lambda: instances(cluster_a) == 2)
                acknowledged = cluster_a.store.last_index()
                await wait.until_sync(
                    "the daemon acknowledged A's log", lambda: core.guard.memory.last_index == acknowledged
                )
                first.cancel_scope.cancel()
            assert core.guard.memory.incarnation == cluster_a.store.incarnation
            before = await listing()
            assert len(before) == 2
            calls_before = len(recorded.calls)

            async with trio.open_nursery() as second:  # controller B: the same address, a fresh store
                running_b = await second.start(serve, serve_config(tmp_path / "ctl-b"))
                cluster_b = running_b.server.cluster
                assert cluster_b.store.incarnation != cluster_a.store.incarnation
                cluster_b.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
                await wait.until_sync("the link halted (amnesia)", lambda: core.session.state is LinkState.HALTED)
                status = (await trio.to_thread.run_sync(query, sock))["status"]
                assert status["link"]["state"] == "halted"
                finding = status["controller"]["finding"]
                assert finding["reason"] == "incarnation_changed"
                assert finding["incarnation"] == cluster_b.store.incarnation and finding["last_index"] == 0
                assert status["controller"]["memory"]["last_index"] == acknowledged
                # Ten replan intervals and more than a lease TTL: nothing may move (the time is what is tested).
                await trio.sleep(3.0)
                assert [c for c in recorded.actions()[calls_before:] if c in MUTATIONS] == []
                assert {m["machineId"] for m in await listing()} == {m["machineId"] for m in before}
                assert cluster_b.store.count() == 0  # nothing committed to the forgetful controller
                assert all(not keeper.valid() for keeper in core.keepers.values())

                code = await trio.to_thread.run_sync(cli.main, ["controller", "accept-reset", "--socket", str(sock)])
                assert code == 0
                assert core.guard.memory.incarnation == cluster_b.store.incarnation
                # The lifecycle resumes: demand 3 on B, whose log knows no machine, so three new ones are made;
                # the two machines A's log explained are kept (the orphan policy only reports them).
                await wait.until_sync("3 instance facts on controller B", lambda: instances(cluster_b) == 3)
                after = await listing()
                assert {m["machineId"] for m in before} <= {m["machineId"] for m in after} and len(after) == 5
                second.cancel_scope.cancel()
        kinds = [json.loads(line)["event"] for line in config.daemon.events_log.read_text().splitlines()]
        assert kinds.count("controller_amnesia") == 1 and kinds.count("controller_reset_accepted") == 1
        assert kinds.index("controller_amnesia") < kinds.index("controller_reset_accepted")

    with short_dir("pd-amn-") as state:
        trio.run(main, state)
