"""One bad ``getAvailableTemplates`` answer costs seconds, not a read interval (issue 31, finding 5).

The simulated provider's first offers read fails (a ``provider_error``, or an answer that is not JSON). The daemon
used to skip every cycle ("offers not read") until its next read a full ``offers_interval`` (60 s) later, with
demand unserved meanwhile; a failed read is now retried after 1 s, doubling. Real processes on the real clock: the
reference controller in this process on mutual TLS, ``provisionerd run`` and the plugin's processes.
"""

from __future__ import annotations

import pytest
import trio
from rigs import procs, wait
from rigs.daemon import Daemon, daemon_config, make_certs, short_dir, simulated_provider
from rigs.facts import facts_of

from provisionerd.domain.model import DemandItem, InstanceFact, ResourceShape

pytestmark = pytest.mark.process


@pytest.mark.parametrize("kind", ["provider_error", "garbage"])
def test_a_failed_first_offers_read_delays_the_demand_by_seconds(tmp_path, kind):
    from refcontroller.api import open_refcontroller

    certs = make_certs(tmp_path, "clu")
    faults = [{"kind": kind, "actions": ["getAvailableTemplates"], "times": 1}]
    sim = simulated_provider(
        tmp_path, sim={"delays": {"bootPolls": 1, "bootSeconds": 0, "returnPolls": 0}, "faults": faults}
    )
    seen: dict = {}

    async def main():
        with short_dir("pd-off-") as state:
            async with (
                open_refcontroller(certs, tmp_path / "ctl", replicas=1, lease_ttl=3.0, check_interval=0.3) as ctl,
                procs.open_procs() as started,
            ):
                await ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
                config = daemon_config(certs, ctl.addresses, state, sim, cluster="clu", identity="prov-offers")
                daemon = Daemon.write(config, tmp_path / "pd.toml", started)
                proc = await daemon.start()
                await daemon.wait_held(60)
                held = trio.current_time()
                await wait.until_sync(
                    "3 instance facts", lambda: len(facts_of(ctl.server.cluster.store, InstanceFact)) >= 3, 60
                )
                seen["met_after"] = trio.current_time() - held
                seen["failed"] = daemon.events("offers_failed")
                seen["rc"] = await proc.stop(20)
                seen["log"] = proc.tail()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"]
    (failed,) = seen["failed"]  # the one bad answer, read again 1 s later
    assert failed["retry_in"] == 1.0 and failed["failures"] == 1
    assert seen["met_after"] < 15.0, seen["met_after"]
