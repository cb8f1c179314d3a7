"""Hard max TTL with drain (issue 20, item 4) with real processes on the real clock: the reference controller (in
this process, real mutual-TLS sockets), the daemon core (in this process: its real session, leases, gate, executor
and loop), the local provider's one-shot plugin processes and the worker agents they start.

A busy machine past ``max_ttl`` is asked to drain: the controller marks its host draining and takes it out of
placement (its ``status`` document's ``placeable``), while the machine keeps running; once its agent reports idle,
the daemon returns it (reason ``drained``) and the agent exits. Its item got a replacement meanwhile.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_procs import alive, cmdline
from local_driver import local_conf, local_provider
from rigs import wait
from rigs.agents import live_agents
from rigs.daemon import daemon_config, short_dir

from provisionerd.config.loader import Backoff, Config, ProviderTimeouts
from provisionerd.config.writer import write_daemon_config
from provisionerd.daemon.clients import provider_clients
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.model import DemandItem, DrainRequested, InstanceFact, ResourceShape, ReturnIntent
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings
from provisionerd.planner.policy import Policy

pytestmark = pytest.mark.process

CLUSTER = "agentcluster"  # the certs fixture's (tests/agent/conftest.py)
#: Long enough for a loaded machine to start the agent, join and turn busy; the drain timeout is far beyond the test.
MAX_TTL, DRAIN_TIMEOUT = 15.0, 600.0


def drain_config(tmp: Path, state: Path, certs: Path, addresses: tuple[str, ...]) -> Config:
    provider = local_provider(tmp, local_conf(certs), max_machines=4, timeouts=ProviderTimeouts(default=30))
    config = daemon_config(
        certs,
        addresses,
        state,
        provider,
        cluster=CLUSTER,
        identity="prov-drain",
        link={"connect_timeout": 5.0, "backoff": Backoff(initial=0.05, max=0.5)},
    )
    return write_daemon_config(config, tmp / "pd.toml")


def agent_of(tmp_path: Path, instance_ref: str) -> int | None:
    for pid in live_agents(str(tmp_path)):
        try:
            argv = cmdline(pid)
        except OSError:
            continue
        if "--instance-ref" in argv and argv[argv.index("--instance-ref") + 1] == instance_ref:
            return pid
    return None


def facts_of(ctl: Any, kind: type) -> list[Any]:
    return [c.fact for c in ctl.server.cluster.store.all_facts() if isinstance(c.fact, kind)]


async def wait_until(predicate, what: str, limit: float = 60.0) -> float:
    """Poll ``predicate`` until true; the monotonic time it was seen true."""
    await wait.until_sync(what, predicate, limit)
    return time.monotonic()


async def wait_status(ctl: Any, what: str, predicate, limit: float = 60.0) -> None:
    """Poll the controller's status document until ``predicate(status)``."""

    async def probe() -> bool:
        return bool(predicate(await ctl.status()))

    await wait.until(what, probe, limit)


def status_of(status: dict[str, Any], ref: str) -> str:
    return next((h["status"] for h in status["hosts"] if h["instance_ref"] == ref), "")


@pytest.mark.long  # max_ttl and the drain run on the real clock
def test_a_busy_machine_past_max_ttl_is_drained_out_of_placement_and_returned_when_idle(
    certs: Path, tmp_path: Path
) -> None:
    from refcontroller.api import open_refcontroller

    seen: dict[str, Any] = {}

    async def main() -> None:
        async with open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=2.0, check_interval=0.5) as ctl:
            config = drain_config(tmp_path, state, certs, ctl.addresses)
            policy = Policy(
                cluster=CLUSTER,
                idle_time=300.0,
                join_deadline=120.0,
                provisioning_timeout=60.0,
                max_ttl=MAX_TTL,
                drain_timeout=DRAIN_TIMEOUT,
            )
            core = DaemonCore(
                config,
                providers=provider_clients(config),
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
                await nursery.start(core.run)
                try:
                    await scenario(ctl)
                finally:
                    with trio.CancelScope(shield=True):
                        await ctl.set_demand([])
                        await wait.until_sync("every agent gone", lambda: not live_agents(str(tmp_path)), 60, 0.1)
                        await core.release_leases()
                    nursery.cancel_scope.cancel()
            core.events.close()

    async def scenario(ctl: Any) -> None:
        await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=1), 1)])
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 1, "the first machine's instance fact")
        (first,) = facts_of(ctl, InstanceFact)
        ref = first.instance_ref
        await wait_until(lambda: agent_of(tmp_path, ref) is not None, "its agent running")
        pid = agent_of(tmp_path, ref)
        assert pid is not None
        await wait_status(ctl, "its host joined", lambda status: status_of(status, ref) in ("joined", "idle"))
        os.kill(pid, signal.SIGUSR1)  # the machine runs work
        await wait_status(ctl, "its host busy", lambda status: status_of(status, ref) == "busy", limit=30)
        # Past max_ttl: asked to drain. The controller marks the host and places nothing more on it.
        await wait_until(lambda: bool(facts_of(ctl, DrainRequested)), "a drain asked for", limit=MAX_TTL + 30)
        (drain,) = facts_of(ctl, DrainRequested)
        seen["drain"] = drain
        seen["launch"] = first.launch_time
        status = await ctl.status()
        host = {h["instance_ref"]: h for h in status["hosts"]}[ref]
        seen["draining_host"] = host
        seen["placeable_while_draining"] = list(status["placeable"])
        seen["returns_while_busy"] = facts_of(ctl, ReturnIntent)
        # The replacement joins and is placeable; the draining one never is, busy or idle.
        await wait_until(lambda: len(facts_of(ctl, InstanceFact)) == 2, "the replacement's instance fact")
        (second,) = [f for f in facts_of(ctl, InstanceFact) if f.instance_ref != ref]
        await wait_status(ctl, "the replacement placeable", lambda status: second.instance_ref in status["placeable"])
        seen["placeable_with_replacement"] = (await ctl.status())["placeable"]
        assert alive(pid)  # draining, still running its work
        os.kill(pid, signal.SIGUSR2)  # the work ended: idle
        idle_at = time.monotonic()
        returned = await wait_until(lambda: bool(facts_of(ctl, ReturnIntent)), "the drained machine's return", limit=30)
        seen["return_after_idle_s"] = returned - idle_at
        seen["returns"] = facts_of(ctl, ReturnIntent)
        await wait_until(lambda: not alive(pid), "its agent gone", limit=60)  # the local provider ended the agent

    with short_dir("pd-drain-") as state:
        trio.run(main)
    drain = seen["drain"]
    assert drain.reason == "max_ttl" and len(drain.machine_ids) == 1
    assert drain.at >= seen["launch"] + MAX_TTL
    host = seen["draining_host"]
    assert host["draining"] is True and host["status"] == "busy"
    assert host["instance_ref"] not in seen["placeable_while_draining"]
    assert host["instance_ref"] not in seen["placeable_with_replacement"]
    assert len(seen["placeable_with_replacement"]) == 1
    assert seen["returns_while_busy"] == []
    (ret,) = seen["returns"]
    assert ret.reason == "drained" and ret.machine_ids == drain.machine_ids
    assert seen["return_after_idle_s"] < 10.0
    print(f"returned {seen['return_after_idle_s']:.2f} s after the agent reported idle")
