"""Median time from a demand snapshot pushed by the reference controller to the start of the ``requestMachines``
call it causes, through the real daemon (session, loop, planner, gate with its intent commit, executor) and the
persistent simulated provider, with 10,000 instances tracked.

Usage: ``python bench/push_to_call.py [--samples N] [--tracked N]``; the last line is
``{"push_to_call_ms_p50": d, "samples": n, "tracked": t}``.

Everything runs in one trio run on loopback TLS (the controller in process, so the push instant can be taken right
before ``broadcast_demand``); the plugin is a real process. The 10,000 tracked instances (1,000 intents of 10
machines) and their joined, busy hosts are put into the controller's store before the daemon starts (see
:func:`seed`), so the daemon's first resync carries them and the planner counts them as a running cluster's.
Each sample raises the demand by one machine and times push -> the call's start (``time.perf_counter`` on both
ends, same process); the interval includes the intent's commit round trip, which the gate requires before any call.
Sampling starts once the daemon may plan: lease held and a resync received after its grant (the daemon plans a
provider only from such a view). Until then a push waits for that resync, about 2.5 s at 10,000 machines on a
loaded 2-core machine, which is start-up, not push -> call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provisionerd.config.loader import Config, ControllerSettings, LeaseSettings, ProviderConfig  # noqa: E402
from provisionerd.config.writer import provisioner_tls, write_daemon_config  # noqa: E402
from provisionerd.daemon.clients import provider_transport  # noqa: E402
from provisionerd.daemon.root import DaemonCore  # noqa: E402
from provisionerd.domain.model import (  # noqa: E402
    DemandItem,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    RequestIntent,
    ResourceShape,
)
from provisionerd.execution.executor import ExecutorSettings  # noqa: E402
from provisionerd.execution.loop import LoopSettings  # noqa: E402
from provisionerd.pki.certs import init_certs  # noqa: E402
from provisionerd.planner.policy import Policy  # noqa: E402
from provisionerd.provider.client import PluginClient  # noqa: E402
from refcontroller.api import open_refcontroller  # noqa: E402

SIMULATED = Path(__file__).resolve().parents[1] / "providers" / "simulated"
CLUSTER = "bench"


class Stamp:
    """Wraps the provider's transport: the perf_counter instant each ``requestMachines`` call starts, by op_id."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.started: dict[str, float] = {}
        self._called = trio.Event()  # set (and replaced) at each requestMachines call

    async def call(self, action: str, input: Any, *, timeout: float | None = None) -> dict[str, Any]:
        if action == "requestMachines":
            self.started.setdefault(input["op_id"], time.perf_counter())
            self._called.set()
            self._called = trio.Event()
        return await self.inner.call(action, input, timeout=timeout)

    async def next_op(self, known: set[str]) -> str:
        """The op_id of the first ``requestMachines`` call whose op_id is not in ``known`` (waits for it)."""
        while not (new := set(self.started) - known):
            await self._called.wait()
        (op,) = new
        return op

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
    config = Config(
        cluster=CLUSTER,
        identity="bench",
        controller=ControllerSettings(addresses),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        providers=(
            ProviderConfig(
                "sim", "persistent", path=SIMULATED / "provider", conf_dir=conf, data_dir=data, max_machines=1_000_000
            ),
        ),
    )
    return write_daemon_config(config, tmp / "pd.toml")


def seed(cluster: Any, tracked: int, identity: str) -> None:
    """Put ``tracked`` instances (intents of 10) and their joined, busy hosts into the controller before the
    daemon starts, through the controller's own store and host table: its first resync then carries them, as it
    would a running cluster's. Setup only (not measured): one store transaction instead of 11,000 commits with an
    fsync each, which took ~2 minutes. The epoch is below any lease the daemon will get in this term, and the
    holder is the daemon's identity, so its lease is granted at once and its own facts continue the log."""
    store, epoch, now = cluster.store, Epoch(cluster.term, 0), time.time()
    with store._transaction():  # nested appends join this one transaction (FactStore's documented behaviour)
        for n in range(tracked // 10):
            op = f"{CLUSTER}:sim:seed:{n}"
            refs = tuple(f"{op}/{i}" for i in range(10))
            hashes = tuple(f"{n:032x}{i:032x}" for i in range(10))
            store.append(RequestIntent("sim", epoch, op, "sim-cpu-8", 10, refs, hashes, "bulk"), identity)
            for i, ref in enumerate(refs):
                machine_id = f"seed-{n}-{i}"
                store.append(
                    InstanceFact("sim", epoch, op, ref, machine_id, "sim-cpu-8", hashes[i], launch_time=now), identity
                )
                cluster.hosts.add(HostState(ref, "sim", machine_id, HostStatus.BUSY, now))


async def measure(samples: int, tracked: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        certs = tmp / "certs"
        init_certs(certs, CLUSTER)
        async with open_refcontroller(certs, tmp / "ctl", replicas=1, lease_ttl=6.0, check_interval=0.5) as ctl:
            assert ctl.server is not None
            config = write_config(tmp, certs, ctl.addresses)
            seed(ctl.server.cluster, tracked, config.identity)
            transport = provider_transport(config, config.provider("sim"))
            stamp = Stamp(transport)
            core = DaemonCore(
                config,
                providers={"sim": PluginClient(stamp)},
                offer_interval=30.0,
                policy=Policy(cluster=CLUSTER, join_deadline=3600.0, step_limit=100_000),
                loop_settings=LoopSettings(replan_interval=5.0, reclaim_interval=3600.0, recover_after=3600.0),
                executor_settings=ExecutorSettings(
                    cluster=CLUSTER, controllers=ctl.addresses, poll_initial=0.01, poll_max=0.05
                ),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(transport.run)
                await nursery.start(core.run)
                with trio.fail_after(30):
                    await core.keepers["sim"].wait_valid()
                    while not core.feed.fresh(["sim"]):  # noqa: ASYNC110 - the offer feed has no event to wait on
                        await trio.sleep(0.01)
                with trio.fail_after(60):  # the resync carried the seeded machines and their hosts...
                    while (  # noqa: ASYNC110 - the session's view has no event for "holds this many hosts"
                        core.session.view is None
                        or len(core.session.view.hosts) < tracked
                        or not core.session.synced_for("sim")
                    ):  # ...and the one after the lease grant
                        await trio.sleep(0.05)
                cluster, server = ctl.server.cluster, ctl.server
                delays: list[float] = []
                for k in range(1, samples + 1):
                    before = set(stamp.started)
                    cluster.set_demand([DemandItem("bench", ResourceShape(ncpus=8), k)])
                    pushed = time.perf_counter()
                    server.broadcast_demand()
                    with trio.fail_after(10):
                        op = await stamp.next_op(before)
                    delays.append((stamp.started[op] - pushed) * 1000)
                    await trio.sleep(0.05)  # let the request finish its polls
                facts = len(core.session.view.facts.machines) if core.session.view else 0
                await core.release_leases()
                nursery.cancel_scope.cancel()
            core.events.close()
    return {
        "push_to_call_ms_p50": round(statistics.median(delays), 3),
        "samples": len(delays),
        "tracked": facts,
        "p90": round(statistics.quantiles(delays, n=10)[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--tracked", type=int, default=10_000)
    args = parser.parse_args()
    print(json.dumps(trio.run(measure, args.samples, args.tracked)))


if __name__ == "__main__":
    main()
