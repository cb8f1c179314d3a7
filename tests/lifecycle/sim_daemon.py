"""The real-clock lifecycle tests' daemon: the shipped simulated provider as a real plugin under the daemon core
(``rigs.core``), in the rig's test config (``rigs.daemon``).

Its machines boot after one status poll (``bootPolls`` 1) and nothing else is delayed, so a lifecycle takes
seconds; the quota (``max_machines`` 20) and the per-call timeout (20 s) are the same for every such test.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rigs.daemon import daemon_config, simulated_provider

from provisionerd.config.loader import Config, ProviderTimeouts
from provisionerd.config.writer import write_daemon_config

CLUSTER = "testcluster"
DELAYS = {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}


def sim_config(
    tmp: Path,
    certs: Path,
    addresses: Sequence[str],
    state: Path,
    *,
    identity: str,
    transport: str = "persistent",
    faults: Sequence[dict[str, Any]] = (),
) -> Config:
    """The daemon's config with the simulated provider ``sim`` (its ``faults`` injected), written to
    ``tmp/pd.toml`` and read back as the daemon would."""
    sim = simulated_provider(
        tmp,
        transport=transport,
        sim={"delays": DELAYS, "faults": list(faults)},
        max_machines=20,
        timeouts=ProviderTimeouts(default=20),
    )
    config = daemon_config(certs, addresses, state, sim, cluster=CLUSTER, identity=identity)
    return write_daemon_config(config, tmp / "pd.toml")
