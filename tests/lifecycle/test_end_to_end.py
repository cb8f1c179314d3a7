"""End to end on the real clock: the reference controller (in this process, real TLS sockets), the daemon core (in
this process, its real session, leases, gate, executor and loop) and the simulated provider as a real plugin
(persistent process or one-shot scripts).

The simulated provider boots nothing, so the test plays the machines: it reads each machine's bootstrap from the
``requestMachines`` input (as cloud user data would deliver it) and runs a real ``WorkerAgent`` with that token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.cli.agent import tls_connector as worker_connector
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
from provisionerd.daemon.clients import provider_clients
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import (
    TAG_CLUSTER,
    DemandItem,
    InstanceFact,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
)
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import PluginClient
from provisionerd.provider.persistent import PersistentProvider

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
SIMULATED = REPO / "providers" / "simulated"
CLUSTER = "testcluster"


class Recorder:
    """Wraps a provider's transport; keeps each machine's bootstrap (the machine's user data) for the test to boot."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.bootstraps: dict[str, str] = {}  # instanceRef -> joinToken
        self.requests: list[str] = []  # op_ids of requestMachines calls, in order

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
        if action == "requestMachines":
            self.requests.append(input["op_id"])
            for boot in input["bootstrap"]:
                self.bootstraps[boot["instanceRef"]] = boot["joinToken"]
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()


def write_config(tmp: Path, certs: Path, addresses: tuple[str, ...], transport: str, faults: list) -> Config:
    conf_dir, data_dir = tmp / "sim-conf", tmp / "sim-data"
    conf_dir.mkdir()
    data_dir.mkdir()
    sim = json.loads((SIMULATED / "conf" / "simulated.json").read_text())
    sim["delays"]["bootPolls"] = 1
    sim["faults"] = faults
    (conf_dir / "simulated.json").write_text(json.dumps(sim))
    path = SIMULATED / "provider" if transport == "persistent" else SIMULATED
    config = Config(
        cluster=CLUSTER,
        identity="prov-e2e",
        controller=ControllerSettings(
            addresses,
            connect_timeout=5,
            request_timeout=5,
            heartbeat_interval=0.5,
            heartbeat_timeout=5,
            backoff=Backoff(initial=0.05, max=0.5),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=tmp / "events.jsonl"),
        providers=(
            ProviderConfig(
                "sim",
                transport,
                path=path,
                conf_dir=conf_dir,
                data_dir=data_dir,
                max_machines=20,
                timeouts=ProviderTimeouts(default=20),
            ),
        ),
    )
    return write_daemon_config(config, tmp / "pd.toml")


def facts_of(ctl: Any, kind: type) -> list[Any]:
    return [c.fact for c in ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]


async def wait_until(predicate, limit: float = 30.0, what: str = "") -> None:
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - waits on any predicate over the system under test, which has no event for it
            await trio.sleep(0.02)


async def run_scenario(tmp: Path, transport: str, faults: list, body) -> dict[str, Any]:
    from provisionerd.pki.certs import init_certs
    from refcontroller.api import open_refcontroller

    certs = tmp / "certs"
    init_certs(certs, CLUSTER)
    out: dict[str, Any] = {}
    async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5) as ctl:
        config = write_config(tmp, certs, ctl.addresses, transport, faults)
        transport = provider_clients(config)["sim"].transport
        recorder = Recorder(transport)
        policy = Policy(
            cluster=CLUSTER, idle_time=1.0, join_deadline=120.0, provisioning_timeout=60.0, capacity_backoff=60.0
        )
        core = DaemonCore(
            config,
            providers={"sim": PluginClient(recorder)},
            policy=policy,
            offer_interval=5.0,
            loop_settings=LoopSettings(replan_interval=0.5, reclaim_interval=5.0, recover_after=10.0),
            executor_settings=ExecutorSettings(
                cluster=CLUSTER,
                controllers=ctl.addresses,
                poll_initial=0.05,
                poll_max=0.5,
                retry_delay=0.1,
                provisioning_timeout=60.0,
            ),
        )
        async with trio.open_nursery() as nursery:
            if isinstance(transport, PersistentProvider):
                await nursery.start(transport.run)
            await nursery.start(core.run)
            try:
                await body(ctl, core, recorder, certs, nursery, out)
            finally:
                with trio.CancelScope(shield=True):
                    await core.release_leases()
                nursery.cancel_scope.cancel()
        core.events.close()
        out["events"] = (tmp / "events.jsonl").read_text()
        out["tokens"] = dict(recorder.bootstraps)
    return out


def live_listing(recorder: Recorder):
    async def listing() -> list[dict[str, Any]]:
        answer = await recorder.inner.call("listMachines", {"tags": {TAG_CLUSTER: CLUSTER}})
        return answer["machines"]

    return listing


@pytest.mark.parametrize("transport", ["persistent", "oneshot"])
def test_demand_up_join_demand_down_return(tmp_path, transport):
    async def body(ctl, core, recorder, certs, nursery, out):
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 2, what="instance facts")
        out["live_up"] = await live_listing(recorder)()
        # The machines boot and join with their bootstrap.
        connect = worker_connector(certs)
        for fact in facts_of(ctl, InstanceFact):
            agent = WorkerAgent(
                AgentConfig(
                    controllers=ctl.addresses, instance_ref=fact.instance_ref, heartbeat_interval=0.5, reply_timeout=5.0
                ),
                recorder.bootstraps[fact.instance_ref],
                connect,
            )
            nursery.start_soon(agent.run)
        await wait_until(lambda: len(ctl.server.cluster.hosts.all()) == 2, what="joined hosts")
        out["hosts"] = ctl.server.cluster.hosts.all()
        await ctl.set_demand([])
        await wait_until(lambda: sum(len(f.machine_ids) for f in facts_of(ctl, Returned)) == 2, what="returned")
        out["live_down"] = await live_listing(recorder)()
        out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]

    out = trio.run(run_scenario, tmp_path, transport, [], body)
    made = [f for f in out["facts"] if isinstance(f, InstanceFact)]
    assert {f.template_id for f in made} == {"sim-cpu-8"}  # the cheapest eligible offer
    assert len(out["live_up"]) == 2 and out["live_down"] == []
    assert {h.instance_ref for h in out["hosts"]} == {f.instance_ref for f in made}
    assert {h.machine_id for h in out["hosts"]} == {f.machine_id for f in made}  # identity from the daemon's fact
    (ret,) = [f for f in out["facts"] if isinstance(f, ReturnIntent)]
    assert ret.reason == "idle" and set(ret.machine_ids) == {f.machine_id for f in made}
    kinds = [type(f).__name__ for f in out["facts"]]
    assert (
        kinds.index("RequestIntent")
        < kinds.index("InstanceFact")
        < kinds.index("ReturnIntent")
        < kinds.index("Returned")
    )
    for token in out["tokens"].values():
        assert token not in out["events"]


def test_capacity_error_falls_over_to_the_next_offer(tmp_path):
    faults = [{"kind": "capacity", "templates": ["sim-cpu-8"]}]

    async def body(ctl, core, recorder, certs, nursery, out):
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 2)
        out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        out["live"] = await live_listing(recorder)()

    out = trio.run(run_scenario, tmp_path, "persistent", faults, body)
    intents = [f for f in out["facts"] if isinstance(f, RequestIntent)]
    assert [i.template_id for i in intents] == ["sim-cpu-8", "sim-mem-16"]
    failed = [f for f in out["facts"] if isinstance(f, RequestFailed)]
    assert [(f.op_id, f.reason) for f in failed] == [(intents[0].op_id, "capacity_unavailable")]
    assert {f.template_id for f in out["facts"] if isinstance(f, InstanceFact)} == {"sim-mem-16"}
    assert len(out["live"]) == 2


@pytest.mark.parametrize("transport", ["persistent", "oneshot"])
def test_a_provider_crash_mid_request_is_recovered_with_the_same_op_id(tmp_path, transport):
    faults = [{"kind": "crash", "actions": ["requestMachines"], "times": 1}]

    async def body(ctl, core, recorder, certs, nursery, out):
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 3)
        await trio.sleep(1.0)  # a few more cycles: nothing else may be requested
        out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        out["live"] = await live_listing(recorder)()
        out["requests"] = list(recorder.requests)

    out = trio.run(run_scenario, tmp_path, transport, faults, body)
    (intent,) = [f for f in out["facts"] if isinstance(f, RequestIntent)]
    # The crashed call only: the listing by op tag showed all 3 machines, so calling again could only harm.
    assert out["requests"] == [intent.op_id]
    assert len(out["live"]) == 3  # no duplicate machines
    assert {m["tags"]["provisionerd:op"] for m in out["live"]} == {intent.op_id}
    assert not [f for f in out["facts"] if isinstance(f, RequestFailed)]
    recovery = [json.loads(line) for line in out["events"].splitlines() if '"recovery"' in line]
    assert recovery and recovery[0]["found"] == 3
