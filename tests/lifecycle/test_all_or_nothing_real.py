"""All-or-nothing items with real processes (issue 35 item 5): ``provisionerd run`` on the simulated provider
against an in-process reference controller (real mutual-TLS sockets; the daemon and the plugin's processes real, on
the real clock).

- The simulated plugin's ``partial`` fault breaks the promise once: an all-or-nothing request of 4 makes 3. The
  daemon is killed (SIGKILL) as soon as that op is failed; the restarted daemon, reading only the facts, returns the
  3 (``all_or_nothing``) and the whole 4 is asked again as one op.
- A GPU item of 5 where the region holds 4 (``capacity``): the plugin refuses the whole request, so nothing is made
  (a plain item would get 4 of 5).
"""

from __future__ import annotations

import pytest
import trio
from rigs import wait
from rigs.simulated_run import simulated_run

from provisionerd.domain.model import (
    DemandItem,
    InstanceFact,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    ReturnIntent,
)

pytestmark = pytest.mark.process


def test_a_partial_answer_is_returned_whole_by_the_restarted_daemon_and_asked_again_as_one_op(tmp_path):
    seen: dict = {}
    item = DemandItem("mpi", ResourceShape(ncpus=8), 4, all_or_nothing=True)

    async def main():
        faults = [{"kind": "partial", "count": 3, "times": 1}]  # the first requestMachines makes 3 of 4
        async with simulated_run(tmp_path, "aon", identity="prov-aon", faults=faults) as run:
            first = await run.daemon.start()
            await run.daemon.wait_held(60)
            await run.ctl.set_demand([item])
            await wait.until_sync("the partial op failed", lambda: bool(run.facts(RequestFailed)), 60)
            first.kill9()  # the worst moment: the op is failed, its 3 machines may not be returned yet
            second = await run.daemon.start()
            await wait.until_sync("4 live machines, all of one op", lambda: len(whole_ops(run.machines())) == 1, 120)
            (op,) = whole_ops(run.machines())
            await wait.until_sync(
                "its 4 instance facts", lambda: len([f for f in run.facts(InstanceFact) if f.op_id == op]) == 4, 60
            )
            seen["op"] = op
            seen["intents"] = run.facts(RequestIntent)
            seen["failed"] = run.facts(RequestFailed)
            seen["instances"] = run.facts(InstanceFact)
            seen["returns"] = run.facts(ReturnIntent)
            seen["machines"] = run.machines()
            seen["rc"] = await second.stop(20)
            seen["log"] = second.tail()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"]
    intents = {i.op_id: i for i in seen["intents"]}
    first, whole = seen["intents"][0], intents[seen["op"]]
    assert (first.count, whole.count, first.all_or_nothing, whole.all_or_nothing) == (4, 4, True, True)
    # The first op: 3 of 4, failed, and its 3 returned (by the first daemon or the restarted one).
    failed = {f.op_id: f.reason for f in seen["failed"]}
    assert failed[first.op_id].startswith("partial: 3 of 4"), failed
    made_first = {f.machine_id for f in seen["instances"] if f.op_id == first.op_id}
    assert len(made_first) == 3
    assert {m for r in seen["returns"] if r.reason == "all_or_nothing" for m in r.machine_ids} == made_first
    # Every other op the daemons asked for was whole, and none but the last made a machine (an op the kill cut
    # short before its call is failed by recovery, "0 of 4 found").
    assert all(i.count == 4 and i.all_or_nothing for i in seen["intents"])
    others = {f.op_id for f in seen["instances"]} - {first.op_id, whole.op_id}
    assert others == set(), others
    assert len(live(seen["machines"])) == 4


def whole_ops(machines: dict) -> set[str]:
    """The op of the live machines when there are exactly 4 and they share one op (else empty)."""
    ops = [m["tags"]["provisionerd:op"] for m in live(machines)]
    return set(ops) if len(ops) == 4 and len(set(ops)) == 1 else set()


def test_an_item_the_region_cannot_hold_whole_makes_nothing(tmp_path):
    seen: dict = {}
    gpus = DemandItem("train", ResourceShape(ncpus=32, gpus=4), 5, all_or_nothing=True)  # sim-gpu-4: capacity 4

    async def main():
        async with simulated_run(tmp_path, "aon-gpu", identity="prov-aon-gpu") as run:
            proc = await run.daemon.start()
            await run.daemon.wait_held(60)
            await run.ctl.set_demand([gpus])
            await wait.until_sync("a refused request", lambda: bool(run.facts(RequestFailed)), 60)
            await trio.sleep(5)  # passes enough to have made machines, had the plugin made what fits
            seen["intents"] = run.facts(RequestIntent)
            seen["failed"] = run.facts(RequestFailed)
            seen["machines"] = run.machines()
            seen["rc"] = await proc.stop(20)
            seen["log"] = proc.tail()

    trio.run(main)
    assert seen["rc"] == 0, seen["log"]
    assert {(i.template_id, i.count, i.all_or_nothing) for i in seen["intents"]} == {("sim-gpu-4", 5, True)}
    assert all("capacity_unavailable" in f.reason for f in seen["failed"]), seen["failed"]
    assert live(seen["machines"]) == []
    assert len(seen["intents"]) == 1  # the capacity back-off holds the next try


def live(machines: dict) -> list[dict]:
    return [m for m in machines.values() if m["state"] in ("pending", "running")]
