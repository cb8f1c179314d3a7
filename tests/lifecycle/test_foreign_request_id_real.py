"""A plugin that answers a requestId it never made (issue 31, finding 3).

The simulated provider's ``foreign_id`` fault: ``requestMachines`` really makes the machines, then answers
``req-ffffffffffff``, which ``getRequestStatus`` reports as ``unknown request``. Read as "nothing was made", the
daemon failed the op and asked again under a new op_id, 10 times in 11 s, and the machines of every earlier op ran
on with no fact. A foreign id is a protocol violation: the op's outcome is unknown, the listing by op tag settles
it, and nothing is requested again meanwhile. A plugin that keeps doing it is unhealthy, with a reason naming the id
it answered.

The reference controller runs in this process on real mutual-TLS sockets; the daemon and the plugin processes are
real processes on the real clock.
"""

from __future__ import annotations

import pytest
import trio
from rigs import wait
from rigs.simulated_run import simulated_run

from provisionerd.domain.model import DemandItem, InstanceFact, RequestFailed, RequestIntent, ResourceShape

pytestmark = pytest.mark.process

FOREIGN = "req-ffffffffffff"


def test_a_foreign_request_id_is_settled_by_the_listing_with_one_request_and_no_leak(tmp_path):
    seen: dict = {}

    async def main():
        faults = [{"kind": "foreign_id"}]  # every requestMachines
        async with simulated_run(tmp_path, "fid", identity="prov-foreign", faults=faults) as run:
            proc = await run.daemon.start()
            await run.daemon.wait_held(60)
            await run.ctl.set_demand([DemandItem("d1", ResourceShape(ncpus=8), 3)])
            await wait.until_sync("3 instance facts", lambda: len(run.facts(InstanceFact)) >= 3, 60)
            await trio.sleep(10)  # what a second, third... request would have done by now
            seen["intents"] = run.facts(RequestIntent)
            seen["failed"] = run.facts(RequestFailed)
            seen["instances"] = run.facts(InstanceFact)
            seen["machines"] = run.machines()
            seen["results"] = [e for e in run.daemon.events("action") if e.get("phase") == "result"]
            seen["rc"] = await proc.stop(20)
            seen["log"] = proc.tail()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"]
    # One request, settled from the listing: its three machines, each with its fact, and nothing else made.
    assert len(seen["intents"]) == 1, [(i.op_id, i.count) for i in seen["intents"]]
    assert seen["failed"] == []
    assert sorted(f.machine_id for f in seen["instances"]) == sorted(seen["machines"])
    assert len(seen["machines"]) == 3
    (result,) = seen["results"]
    assert result["status"] == "fulfilled", result
    assert FOREIGN in seen["log"]  # the violation is said, naming the id the plugin answered
