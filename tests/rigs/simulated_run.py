"""One ``provisionerd run`` on the simulated provider against an in-process reference controller (real mutual-TLS
sockets; the daemon and the plugin's processes real, on the real clock): the set-up the real-process lifecycle
tests share (issue 31 item 5: it was written out in each).

    async with simulated_run(tmp_path, "fid", identity="prov-x", faults=[...]) as run:
        await run.daemon.start()
        await run.daemon.wait_held(60)
        await run.ctl.set_demand([...])
        await wait.until_sync("3 instance facts", lambda: len(run.facts(InstanceFact)) >= 3, 60)

Everything it started is stopped when the block ends, however it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from provisionerd.config.loader import ProviderConfig
from rigs import procs
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir, simulated_machines, simulated_provider
from rigs.facts import facts_of

#: The simulated machines boot at their first status poll and go back at once, unless a test says otherwise.
QUICK = {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}


@attrs.frozen
class SimulatedRun:
    ctl: Any  # refcontroller.api's in-process controller (``addresses``, ``set_demand``, ``server``)
    daemon: Daemon
    provider: ProviderConfig

    def facts(self, kind: type) -> list[Any]:
        """The controller's committed facts of ``kind``."""
        return facts_of(self.ctl.server.cluster.store, kind)

    def machines(self) -> dict[str, Any]:
        """The simulated cloud's machines."""
        return simulated_machines(self.provider)


@asynccontextmanager
async def simulated_run(
    tmp_path: Path,
    name: str,
    *,
    identity: str,
    delays: dict[str, Any] | None = None,
    faults: Sequence[dict[str, Any]] = (),
    provider: Mapping[str, Any] | None = None,
    plugin: Path | None = None,
) -> AsyncIterator[SimulatedRun]:
    """The controller (1 replica, lease TTL 3 s) and a written daemon config (cluster ``clu``), not started yet.
    ``provider``: more of the provider's config (``capacity_backoff``...); ``plugin``: the one-shot scripts'
    directory to run instead of the shipped one (wrappers around its scripts)."""
    from refcontroller.api import open_refcontroller

    certs = make_certs(tmp_path, "clu")
    sim_options: dict[str, Any] = {"delays": delays if delays is not None else QUICK}
    if faults:
        sim_options["faults"] = list(faults)
    sim = simulated_provider(tmp_path, sim=sim_options, plugin=plugin, **(provider or {}))
    with short_dir(f"pd-{name}-") as state:
        async with (
            open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl,
            procs.open_procs() as started,
        ):
            config = daemon_config(certs, ctl.addresses, state, sim, cluster="clu", identity=identity)
            yield SimulatedRun(ctl, Daemon.write(config, tmp_path / "pd.toml", started), sim)
