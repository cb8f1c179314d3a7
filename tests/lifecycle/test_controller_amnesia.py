"""A daemon whose controller comes back with a fresh store: no provider call and every machine kept until the admin
accepts the reset, then the lifecycle resumes (real clock: the reference controller on real TLS sockets in this
process, the daemon core, the simulated provider as a real persistent plugin, the admin socket and the CLI).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

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
    ProviderTimeouts,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.controller.session_settings import LinkState
from provisionerd.daemon.admin_socket import query
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import TAG_CLUSTER, DemandItem, InstanceFact, ResourceShape
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import PluginClient
from provisionerd.provider.persistent import PersistentProvider

pytestmark = pytest.mark.process

MUTATIONS = {"requestMachines", "returnMachines", "terminateMachines"}


class Recorder:
    """Wraps the plugin's transport and records every action called, in order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[str] = []

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.calls.append(action)
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def mutations(self) -> list[str]:
        return [c for c in self.calls if c in MUTATIONS]


CLUSTER = "testcluster"
SIMULATED = Path(__file__).resolve().parents[2] / "providers" / "simulated"


def write_config(tmp: Path, certs: Path, address: str, admin_socket: Path) -> Config:
    conf_dir, data_dir = tmp / "sim-conf", tmp / "sim-data"
    conf_dir.mkdir()
    data_dir.mkdir()
    sim = json.loads((SIMULATED / "conf" / "simulated.json").read_text())
    sim["delays"]["bootPolls"] = 1
    (conf_dir / "simulated.json").write_text(json.dumps(sim))
    config = Config(
        cluster=CLUSTER,
        identity="prov-amnesia",
        controller=ControllerSettings(
            (address,),
            connect_timeout=5,
            request_timeout=5,
            heartbeat_interval=0.5,
            heartbeat_timeout=5,
            backoff=Backoff(initial=0.05, max=0.5),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=tmp / "events.jsonl", admin_socket=admin_socket),
        providers=(
            ProviderConfig(
                "sim",
                "persistent",
                path=SIMULATED / "provider",
                conf_dir=conf_dir,
                data_dir=data_dir,
                max_machines=20,
                timeouts=ProviderTimeouts(default=20),
            ),
        ),
    )
    return write_daemon_config(config, tmp / "pd.toml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_until(predicate, limit: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - polls the system under test, which has no event for it
            await trio.sleep(0.02)


def test_a_controller_restarted_on_a_fresh_store_gets_no_mutation_until_accept_reset(tmp_path: Path) -> None:

    from provisionerd.pki.certs import init_certs
    from refcontroller.listeners import ServeConfig, serve

    certs = tmp_path / "certs"
    init_certs(certs, CLUSTER)
    address = f"127.0.0.1:{free_port()}"
    state = tmp_path / "state"
    state.mkdir(mode=0o700)

    async def main() -> None:
        config = write_config(tmp_path, certs, address, state / "admin.sock")
        sim = config.providers[0]
        from provisionerd.daemon.clients import provider_clients

        transport = provider_clients(config)[sim.name].transport
        recorder = Recorder(transport)
        core = DaemonCore(
            config,
            providers={sim.name: PluginClient(recorder)},
            policy=Policy(cluster=CLUSTER, idle_time=600.0, join_deadline=600.0, provisioning_timeout=60.0),
            offer_interval=5.0,
            loop_settings=LoopSettings(replan_interval=0.3, reclaim_interval=5.0, recover_after=10.0),
            executor_settings=ExecutorSettings(
                cluster=CLUSTER, controllers=(address,), poll_initial=0.05, poll_max=0.5, retry_delay=0.1
            ),
        )

        def serve_config(data: Path) -> ServeConfig:
            return ServeConfig(certs_dir=certs, data_dir=data, listen=(address,), lease_ttl=2.0, check_interval=0.3)

        async def listing() -> list[dict[str, Any]]:
            answer = await transport.call("listMachines", {"tags": {TAG_CLUSTER: CLUSTER}})
            return list(answer["machines"])

        async with trio.open_nursery() as nursery:
            assert isinstance(transport, PersistentProvider)
            await nursery.start(transport.run)
            async with trio.open_nursery() as first:  # controller A: two machines, their facts acknowledged
                running = await first.start(serve, serve_config(tmp_path / "ctl-a"))
                cluster_a = running.server.cluster
                await nursery.start(core.run)
                cluster_a.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
                await wait_until(
                    lambda: sum(isinstance(c.fact, InstanceFact) for c in cluster_a.store.all_facts()) == 2
                )
                acknowledged = cluster_a.store.last_index()
                await wait_until(lambda: core.guard.memory.last_index == acknowledged)
                first.cancel_scope.cancel()
            assert core.guard.memory.incarnation == cluster_a.store.incarnation
            before = await listing()
            assert len(before) == 2
            calls_before = len(recorder.calls)

            async with trio.open_nursery() as second:  # controller B: the same address, a fresh store
                running = await second.start(serve, serve_config(tmp_path / "ctl-b"))
                cluster_b = running.server.cluster
                assert cluster_b.store.incarnation != cluster_a.store.incarnation
                cluster_b.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
                await wait_until(lambda: core.session.state is LinkState.HALTED)
                status = (await trio.to_thread.run_sync(query, state / "admin.sock"))["status"]
                assert status["link"]["state"] == "halted"
                finding = status["controller"]["finding"]
                assert finding["reason"] == "incarnation_changed"
                assert finding["incarnation"] == cluster_b.store.incarnation and finding["last_index"] == 0
                assert status["controller"]["memory"]["last_index"] == acknowledged
                await trio.sleep(3.0)  # ten replan intervals and more than a lease TTL: nothing may move
                assert [c for c in recorder.calls[calls_before:] if c in MUTATIONS] == []
                assert {m["machineId"] for m in await listing()} == {m["machineId"] for m in before}
                assert cluster_b.store.count() == 0  # nothing committed to the forgetful controller
                assert all(not keeper.valid() for keeper in core.keepers.values())

                code = await trio.to_thread.run_sync(
                    cli.main, ["controller", "accept-reset", "--socket", str(state / "admin.sock")]
                )
                assert code == 0
                assert core.guard.memory.incarnation == cluster_b.store.incarnation
                # The lifecycle resumes: demand 3 on B, whose log knows no machine, so three new ones are made;
                # the two machines A's log explained are kept (the orphan policy only reports them).
                await wait_until(
                    lambda: sum(isinstance(c.fact, InstanceFact) for c in cluster_b.store.all_facts()) == 3
                )
                after = await listing()
                assert {m["machineId"] for m in before} <= {m["machineId"] for m in after} and len(after) == 5
                second.cancel_scope.cancel()
            await core.release_leases(0.5)
            nursery.cancel_scope.cancel()
        core.events.close()
        kinds = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert kinds.count("controller_amnesia") == 1 and kinds.count("controller_reset_accepted") == 1
        assert kinds.index("controller_amnesia") < kinds.index("controller_reset_accepted")

    trio.run(main)
