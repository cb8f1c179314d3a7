"""End to end on the real clock: the reference controller (in this process, real TLS sockets), the daemon core (in
this process, its real session, leases, gate, executor and loop) and the simulated provider as a real plugin
(persistent process or one-shot scripts).

The simulated provider boots nothing, so the test plays the machines: it reads each machine's bootstrap from the
``requestMachines`` input (as cloud user data would deliver it) and runs a real ``WorkerAgent`` with that token.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import wait
from rigs.core import Recorder, daemon_core, record, running
from rigs.daemon import make_certs, short_dir
from rigs.facts import facts_of
from sim_daemon import CLUSTER, sim_config

from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.cli.agent import tls_connector as worker_connector
from provisionerd.domain.model import (
    TAG_CLUSTER,
    DemandItem,
    HostStatus,
    InstanceFact,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
)
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy

pytestmark = pytest.mark.process


def logged(ctl: Any, kind: type) -> list[Any]:
    """The facts of ``kind`` in the in-process controller's log."""
    return facts_of(ctl.server.cluster.store, kind)


def bootstraps(recorded: Recorder) -> dict[str, str]:
    """Each machine's bootstrap (its user data) from the ``requestMachines`` inputs: instanceRef -> joinToken."""
    return {b["instanceRef"]: b["joinToken"] for i in recorded.inputs("requestMachines") for b in i["bootstrap"]}


async def until(what: str, predicate: Any) -> None:
    await wait.until_sync(what, predicate, 30, interval=0.02)


async def run_scenario(tmp: Path, transport: str, faults: list, body) -> dict[str, Any]:
    from refcontroller.api import open_refcontroller

    certs = make_certs(tmp, CLUSTER)
    out: dict[str, Any] = {}
    with short_dir("pd-e2e-") as state:
        async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5) as ctl:
            config = sim_config(
                tmp, certs, ctl.addresses, state, identity="prov-e2e", transport=transport, faults=faults
            )
            recorded = record(config, "sim")
            policy = Policy(
                cluster=CLUSTER, idle_time=1.0, join_deadline=120.0, provisioning_timeout=60.0, capacity_backoff=60.0
            )
            loop = LoopSettings(replan_interval=0.5, reclaim_interval=5.0, recover_after=10.0)
            core = daemon_core(config, policy=policy, loop=loop, recorded=recorded)
            async with running(core, recorded.inner) as nursery:
                await body(ctl, core, recorded, certs, nursery, out)
            out["events"] = config.daemon.events_log.read_text()
            out["tokens"] = bootstraps(recorded)
    return out


def both_idle(core: Any, idle_time: float) -> bool:
    """The daemon's own view holds two hosts, both idle for longer than ``idle_time`` (wall seconds)."""
    view = core.session.view
    hosts = [] if view is None else list(view.hosts.values())
    return len(hosts) == 2 and all(h.status is HostStatus.IDLE and time.time() - h.since > idle_time for h in hosts)


async def live_listing(recorded: Recorder) -> list[dict[str, Any]]:
    """The plugin's own listing of the cluster's machines (past the recorder: not one of the daemon's calls)."""
    answer = await recorded.inner.call("listMachines", {"tags": {TAG_CLUSTER: CLUSTER}})
    return answer["machines"]


@pytest.mark.parametrize("transport", ["persistent", "oneshot"])
def test_demand_up_join_demand_down_return(tmp_path, transport):
    async def body(ctl, core, recorder, certs, nursery, out):
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 2)])
        await until("2 instance facts", lambda: len(logged(ctl, InstanceFact)) == 2)
        out["live_up"] = await live_listing(recorder)
        # The machines boot and join with their bootstrap.
        connect = worker_connector(certs)
        for fact in logged(ctl, InstanceFact):
            agent = WorkerAgent(
                AgentConfig(
                    controllers=ctl.addresses, instance_ref=fact.instance_ref, heartbeat_interval=0.5, reply_timeout=5.0
                ),
                bootstraps(recorder)[fact.instance_ref],
                connect,
            )
            nursery.start_soon(agent.run)
        await until("2 joined hosts", lambda: len(ctl.server.cluster.hosts.all()) == 2)
        out["hosts"] = ctl.server.cluster.hosts.all()
        # Demand drops once the daemon itself sees both hosts idle for longer than idle_time, so that one pass
        # returns both in one op. Dropping it as soon as the controller had both let a loaded machine's daemon see
        # the first host idle long enough a pass before the second: two ReturnIntents (a flake under CPU load).
        await until("the daemon sees both hosts idle past idle_time", lambda: both_idle(core, 1.0))
        await ctl.set_demand([])
        await until("2 machines returned", lambda: sum(len(f.machine_ids) for f in logged(ctl, Returned)) == 2)
        out["live_down"] = await live_listing(recorder)
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
        await until("2 instance facts", lambda: len(logged(ctl, InstanceFact)) == 2)
        out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        out["live"] = await live_listing(recorder)

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
        await until("3 instance facts", lambda: len(logged(ctl, InstanceFact)) == 3)
        cycles = core.loop.cycles
        await until("two more reconcile passes (nothing else may be requested)", lambda: core.loop.cycles >= cycles + 2)
        out["facts"] = [c.fact for c in ctl.server.cluster.store.all_facts()]
        out["live"] = await live_listing(recorder)
        out["requests"] = [i["op_id"] for i in recorder.inputs("requestMachines")]

    out = trio.run(run_scenario, tmp_path, transport, faults, body)
    (intent,) = [f for f in out["facts"] if isinstance(f, RequestIntent)]
    # The crashed call only: the listing by op tag showed all 3 machines, so calling again could only harm.
    assert out["requests"] == [intent.op_id]
    assert len(out["live"]) == 3  # no duplicate machines
    assert {m["tags"]["provisionerd:op"] for m in out["live"]} == {intent.op_id}
    assert not [f for f in out["facts"] if isinstance(f, RequestFailed)]
    recovery = [json.loads(line) for line in out["events"].splitlines() if '"recovery"' in line]
    assert recovery and recovery[0]["found"] == 3
