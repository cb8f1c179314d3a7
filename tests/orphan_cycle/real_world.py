"""The orphan cycle with real processes: the reference controller in this process (real mutual-TLS sockets), one
``provisionerd run`` for cluster ``clu`` serving the simulated provider's one-shot plugin, and the ``provisionerd
orphans`` CLI, all on the real clock.

The provider carries a credential in its environment (``SECRET``) that no log, event or output may show.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
from rigs import procs
from rigs.daemon import Daemon, daemon_config, make_certs, simulated_provider

from provisionerd.config.loader import OrphanSettings, ProviderConfig
from provisionerd.domain.model import CommittedFact

SECRET = "do-not-leak-this-credential"


def sim(home: Path, *, sim: Mapping[str, Any] | None = None, **orphans: Any) -> ProviderConfig:
    """The simulated provider ``sim`` with ``SECRET`` in its environment and ``orphans`` as its orphan settings."""
    return simulated_provider(home, sim=sim, env={"SIM_SECRET": SECRET}, orphans=OrphanSettings(**orphans))


@attrs.frozen
class RealWorld:
    """The controller, the daemon (its config written, not started) and its provider."""

    ctl: Any
    daemon: Daemon
    provider: ProviderConfig

    @property
    def data(self) -> Path:
        """The simulated provider's data directory (``sim_state`` edits and reads its state file)."""
        assert self.provider.data_dir is not None
        return self.provider.data_dir

    def facts(self) -> list[CommittedFact]:
        return list(self.ctl.server.cluster.store.all_facts())

    async def orphans(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``provisionerd orphans ARGV --config <the daemon's config>`` to its end."""
        return await procs.run_async(procs.provisionerd("orphans", *argv, "--config", self.daemon.path))


@asynccontextmanager
async def real_world(
    tmp_path: Path, state: Path, provider: ProviderConfig, identity: str = "prov-main"
) -> AsyncIterator[RealWorld]:
    """Certificates for ``clu``, the controller (1 replica, lease ttl 5 s) and the daemon's config (events log and
    admin socket in ``state``); every process started is stopped at the end."""
    from refcontroller.api import open_refcontroller

    certs = make_certs(tmp_path, "clu")
    async with (
        open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=5.0, check_interval=0.5) as ctl,
        procs.open_procs() as started,
    ):
        config = daemon_config(certs, ctl.addresses, state, provider, cluster="clu", identity=identity)
        yield RealWorld(ctl, Daemon.write(config, tmp_path / "pd.toml", started), provider)
