"""Median time from a demand snapshot pushed by the reference controller to the start of the ``requestMachines``
call it causes, through the real daemon (session, loop, planner, gate with its intent commit, executor) and the
persistent simulated provider, with 10,000 instances tracked.

Usage: ``python bench/push_to_call.py [--samples N] [--tracked N]``; the last line is
``{"push_to_call_ms_p50": d, "samples": n, "tracked": t}``.

Everything runs in one trio run on loopback TLS (the controller in process, so the push instant can be taken right
before ``broadcast_demand``); the plugin is a real process. The 10,000 tracked instances are committed through the
daemon first (1,000 intents of 10 machines) and shown to it as joined, busy hosts (pushed by the controller), so
the planner carries them as a running cluster's. Each sample raises the
demand by one machine and times push -> the call's start (``time.perf_counter`` on both ends, same process); the
interval includes the intent's commit round trip, which the gate requires before any call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provisionerd.certs import init_certs  # noqa: E402
from provisionerd.config import Config  # noqa: E402
from provisionerd.daemon import DaemonCore, provider_clients  # noqa: E402
from provisionerd.errors import LeaseError  # noqa: E402
from provisionerd.executor import ExecutorSettings  # noqa: E402
from provisionerd.model import (  # noqa: E402
    NO_EPOCH, DemandItem, HostState, HostStatus, InstanceFact, RequestIntent, ResourceShape,
)  # fmt: skip
from provisionerd.policy import Policy  # noqa: E402
from provisionerd.reconcile_loop import LoopSettings  # noqa: E402
from refcontroller.api import open_refcontroller  # noqa: E402

SIMULATED = Path(__file__).resolve().parents[1] / "providers" / "simulated"
CLUSTER = "bench"


class Stamp:
    """Wraps the provider client: the perf_counter instant each ``requestMachines`` call starts, by op_id."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.started: dict[str, float] = {}

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
        if action == "requestMachines":
            self.started.setdefault(input["op_id"], time.perf_counter())
        return await self.inner.call(action, input, timeout=timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()


def write_config(tmp: Path, certs: Path, addresses: tuple[str, ...]) -> Config:
    conf, data = tmp / "conf", tmp / "data"
    conf.mkdir()
    data.mkdir()
    sim = json.loads((SIMULATED / "conf" / "simulated.json").read_text())
    sim["delays"]["bootPolls"] = 0
    sim["quota"]["maxMachines"] = 100_000
    (conf / "simulated.json").write_text(json.dumps(sim))
    (tmp / "pd.toml").write_text(textwrap.dedent(f"""
        cluster = "{CLUSTER}"
        identity = "bench"
        [controller]
        addresses = {json.dumps(list(addresses))}
        [tls]
        ca = "{certs}/ca.pem"
        cert = "{certs}/provisioner.pem"
        key = "{certs}/provisioner.key"
        [lease]
        margin = 0.5
        [[providers]]
        name = "sim"
        transport = "persistent"
        path = "{SIMULATED / 'provider'}"
        conf_dir = "{conf}"
        data_dir = "{data}"
        max_machines = 1000000
    """))
    return Config.from_file(tmp / "pd.toml")


async def track(core: DaemonCore, tracked: int) -> None:
    """Commit ``tracked`` instances (intents of 10) through the daemon, many commits in flight."""
    limiter = trio.CapacityLimiter(16)
    now = time.time()

    async def commit(fact: Any) -> None:
        while True:
            try:
                await core.executor.commit_fact(fact)
                return
            except LeaseError:  # a renewal starved by the bulk load: wait for the lease and carry on
                await core.keepers["sim"].wait_valid()

    async def one_intent(n: int) -> None:
        async with limiter:
            op = f"{CLUSTER}:sim:seed:{n}"
            refs = tuple(f"{op}/{i}" for i in range(10))
            hashes = tuple(f"{n:032x}{i:032x}" for i in range(10))
            await commit(RequestIntent("sim", NO_EPOCH, op, "sim-cpu-8", 10, refs, hashes, "bulk"))
            for i in range(10):
                await commit(InstanceFact("sim", NO_EPOCH, op, refs[i], f"seed-{n}-{i}",
                                                             "sim-cpu-8", hashes[i], launch_time=now))

    async with trio.open_nursery() as nursery:
        for n in range(tracked // 10):
            nursery.start_soon(one_intent, n)


async def measure(samples: int, tracked: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        certs = tmp / "certs"
        init_certs(certs, CLUSTER)
        async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=6.0, check_interval=0.5) as ctl:
            assert ctl.server is not None
            config = write_config(tmp, certs, ctl.addresses)
            clients = provider_clients(config)
            stamp = Stamp(clients["sim"])
            core = DaemonCore(
                config, providers={"sim": stamp}, offer_interval=30.0,
                policy=Policy(cluster=CLUSTER, join_deadline=3600.0, step_limit=100_000),
                loop_settings=LoopSettings(replan_interval=5.0, reclaim_interval=3600.0, recover_after=3600.0),
                executor_settings=ExecutorSettings(cluster=CLUSTER, controllers=ctl.addresses, poll_initial=0.01,
                                                   poll_max=0.05),
            )  # fmt: skip
            async with trio.open_nursery() as nursery:
                await nursery.start(clients["sim"].run)
                await nursery.start(core.run)
                with trio.fail_after(30):
                    await core.keepers["sim"].wait_valid()
                    while not core.feed.fresh(["sim"]):
                        await trio.sleep(0.01)
                await track(core, tracked)
                cluster, server = ctl.server.cluster, ctl.server
                # The tracked machines joined and are busy (as most of a running cluster's are).
                for record in list(core.session.view.facts.machines.values()):
                    host = HostState(record.instance_ref, "sim", record.machine_id, HostStatus.BUSY, time.time())
                    cluster.hosts.add(host)
                    server.broadcast_host(host)
                with trio.fail_after(60):
                    while len(core.session.view.hosts) < tracked:
                        await trio.sleep(0.05)
                delays: list[float] = []
                for k in range(1, samples + 1):
                    before = set(stamp.started)
                    cluster.set_demand([DemandItem("bench", ResourceShape(ncpus=8), k)])
                    pushed = time.perf_counter()
                    server.broadcast_demand()
                    with trio.fail_after(10):
                        while set(stamp.started) == before:
                            await trio.sleep(0.0005)
                    (op,) = set(stamp.started) - before
                    delays.append((stamp.started[op] - pushed) * 1000)
                    await trio.sleep(0.05)  # let the request finish its polls
                facts = len(core.session.view.facts.machines) if core.session.view else 0
                await core.release_leases()
                nursery.cancel_scope.cancel()
            core.events.close()
    return {"push_to_call_ms_p50": round(statistics.median(delays), 3), "samples": len(delays), "tracked": facts,
            "p90": round(statistics.quantiles(delays, n=10)[-1], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--tracked", type=int, default=10_000)
    args = parser.parse_args()
    print(json.dumps(trio.run(measure, args.samples, args.tracked)))


if __name__ == "__main__":
    main()
