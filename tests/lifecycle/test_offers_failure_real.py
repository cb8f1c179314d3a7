"""One bad ``getAvailableTemplates`` answer costs seconds, not a read interval (issue 31, finding 5).

The simulated provider's first offers read fails (a ``provider_error``, or an answer that is not JSON). The daemon
used to skip every cycle ("offers not read") until its next read a full ``offers_interval`` (60 s) later, with
demand unserved meanwhile; a failed read is now retried after 1 s, doubling. Real processes on the real clock: the
reference controller in this process on mutual TLS, ``provisionerd run`` and the plugin's processes.
"""

from __future__ import annotations

import pytest
import trio
from rigs import wait
from rigs.simulated_run import simulated_run

from provisionerd.domain.model import DemandItem, InstanceFact, ResourceShape

pytestmark = pytest.mark.process


@pytest.mark.parametrize("kind", ["provider_error", "garbage"])
def test_a_failed_first_offers_read_delays_the_demand_by_seconds(tmp_path, kind):
    seen: dict = {}

    async def main():
        faults = [{"kind": kind, "actions": ["getAvailableTemplates"], "times": 1}]
        async with simulated_run(tmp_path, "off", identity="prov-offers", faults=faults) as run:
            await run.ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
            proc = await run.daemon.start()
            await run.daemon.wait_held(60)
            held = trio.current_time()
            await wait.until_sync("3 instance facts", lambda: len(run.facts(InstanceFact)) >= 3, 60)
            seen["met_after"] = trio.current_time() - held
            seen["failed"] = run.daemon.events("offers_failed")
            seen["rc"] = await proc.stop(20)
            seen["log"] = proc.tail()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"]
    (failed,) = seen["failed"]  # the one bad answer, read again 1 s later
    assert failed["retry_in"] == 1.0 and failed["failures"] == 1
    assert seen["met_after"] < 15.0, seen["met_after"]
