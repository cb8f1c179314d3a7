"""What legacy plugins cannot promise, caught: silent partial fulfilment, returns that "succeed" for running machines,
requestMachines that time out (no blind retry, no duplicates), machines the cloud reclaims."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from provisionerd.domain.errors import ProviderOutcomeUnknown, ProviderTimeout
from provisionerd.provider.legacy.adapter import REQUEST_PREFIX, LegacyProvider
from provisionerd.provider.legacy.rules import (
    LEGACY_FEATURES,
    NextStep,
    after_request_error,
    fulfilment,
    invisible_classes,
)

pytestmark = pytest.mark.process


async def plugin_view(client: LegacyProvider, op_id: str) -> dict:
    """The plugin's own getRequestStatus entry of an op's (single) plugin request: what it claims."""
    (call,) = client.journal.creates[op_id].accepted()
    out = await client.runner.run_document("getRequestStatus", {"requests": [{"requestId": call.request_id}]})
    return out["requests"][0]


def test_fewer_machines_than_asked_under_a_success_is_a_shortfall(world, h):
    world.settings({"SHORT_FILL": 1})

    async def main():
        client = world.adapter()
        out = await client.call("requestMachines", world.request("op-1", 3))
        entry = await h.settle(client, out["requestId"])
        return entry, await plugin_view(client, "op-1")

    entry, claimed = trio.run(main)
    assert claimed["status"] == "complete" and len(claimed["machines"]) == 2  # the plugin's word: all is well
    assert entry["status"] == "complete_with_error"
    assert "partial fulfilment: the plugin reported complete with 2 of 3 machines" in entry["message"]
    assert sorted(m["instanceRef"] for m in entry["machines"]) == ["op-1/i-0", "op-1/i-1"]
    counted = fulfilment(3, entry)
    assert counted.shortfall == 1 and counted.finished  # the daemon re-plans one machine
    assert fulfilment(3, claimed).silent_partial


def test_a_return_that_succeeds_for_a_running_machine_is_caught_on_the_next_poll(world, h):
    async def main():
        client = world.adapter()
        out = await client.call("requestMachines", world.request("op-1", 2))
        machines = (await h.settle(client, out["requestId"]))["machines"]
        world.settings({"STICKY_RETURN": True})
        ret = await client.call("requestReturnMachines", world.return_input("op-2", machines[:1]))
        return machines, await h.settle(client, ret["requestId"])

    machines, entry = trio.run(main)
    assert entry["status"] == "complete_with_error"
    (m,) = entry["machines"]
    assert m["machineId"] == machines[0]["machineId"] and m["result"] == "fail"
    assert "still shows it running" in m["message"]
    assert world.plugin_state()["machines"][m["machineId"]]["status"] == "running"  # the plugin did lie


def test_an_honest_return_is_confirmed(world, h):
    async def main():
        client = world.adapter()
        out = await client.call("requestMachines", world.request("op-1", 1))
        machines = (await h.settle(client, out["requestId"]))["machines"]
        ret = await client.call("requestReturnMachines", world.return_input("op-2", machines))
        again = await client.call("requestReturnMachines", world.return_input("op-2", machines))
        assert again["requestId"] == ret["requestId"]
        return await h.settle(client, ret["requestId"])

    entry = trio.run(main)
    assert entry["status"] == "complete" and entry["machines"][0]["result"] == "succeed"
    assert len(world.inputs("requestReturnMachines")) == 1  # the repeat was answered from the journal


@pytest.mark.parametrize("phase", ["after_create", "before_create"])
def test_a_request_that_times_out_is_never_retried(world, h, phase):
    world.settings({"SLOW_REQUEST_SECONDS": 60, "SLOW_REQUEST_PHASE": phase})

    async def main():
        client = world.adapter()
        with pytest.raises(ProviderTimeout) as caught:
            await client.call("requestMachines", world.request("op-1", 2), timeout=1.0)
        assert after_request_error(caught.value, LEGACY_FEATURES) is NextStep.UNKNOWN_OUTCOME
        world.settings({})  # the plugin is fast again: a retry would now surely create machines
        with pytest.raises(ProviderOutcomeUnknown, match="not retried"):
            await client.call("requestMachines", world.request("op-1", 2))
        # A fresh adapter over the same journal (a daemon restart) refuses too.
        with pytest.raises(ProviderOutcomeUnknown):
            await world.adapter().call("requestMachines", world.request("op-1", 2))
        status = await client.call("getRequestStatus", {"requests": [{"requestId": REQUEST_PREFIX + "op-1"}]})
        return client.unknown_outcomes(), status["requests"][0]

    unknown, entry = trio.run(main)
    assert len(world.inputs("requestMachines")) == 1  # one attempt reached the plugin, ever
    made = world.plugin_state()["machines"] if phase == "after_create" else {}
    assert len(made) == (2 if phase == "after_create" else 0)  # only what the first attempt made, invisible to us
    assert [u["op_id"] for u in unknown] == ["op-1"] and unknown[0]["instance_refs"] == ["op-1/i-0", "op-1/i-1"]
    assert entry["status"] == "complete_with_error" and entry["machines"] == []
    assert "outcome is unknown" in entry["message"] and "invisible" in entry["message"]
    assert invisible_classes(LEGACY_FEATURES) == ("tagged_unknown", "ghost")


def test_a_request_id_printed_before_a_hang_is_recovered(world, h):
    world.settings({"SLOW_REQUEST_SECONDS": 60, "SLOW_REQUEST_PHASE": "after_answer"})

    async def main():
        client = world.adapter()
        out = await client.call("requestMachines", world.request("op-1", 2), timeout=1.0)
        return await h.settle(client, out["requestId"]), client.unknown_outcomes()

    entry, unknown = trio.run(main)
    assert entry["status"] == "complete" and len(entry["machines"]) == 2
    assert unknown == []


@asynccontextmanager
async def a_request_in_flight(world: Any) -> AsyncIterator[Any]:
    """An adapter whose ``requestMachines`` for op-1 hangs in the plugin (``SLOW_REQUEST_SECONDS`` 60), yielded once
    the plugin has its input; the call is cancelled at the end (it dies with its process group)."""
    world.settings({"SLOW_REQUEST_SECONDS": 60})
    client = world.adapter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.call, "requestMachines", world.request("op-1", 1))
        await world.wait_input("requestMachines")
        yield client
        nursery.cancel_scope.cancel()


def test_a_daemon_killed_mid_call_leaves_an_unknown_outcome(world):
    async def main():
        async with a_request_in_flight(world):
            at_death = world.journal.read_bytes()  # what a SIGKILLed daemon would leave behind
        saved = json.loads(world.journal.read_text())
        assert saved["creates"][0]["calls"][0]["state"] == "unknown"  # cancelled: recorded as unknown at once
        assert json.loads(at_death)["creates"][0]["calls"][0]["state"] == "calling"
        world.journal.write_bytes(at_death)
        restarted = world.adapter()
        with pytest.raises(ProviderOutcomeUnknown):
            await restarted.call("requestMachines", world.request("op-1", 1))
        return restarted.unknown_outcomes()

    assert [u["op_id"] for u in trio.run(main)] == ["op-1"]


def test_a_second_call_while_the_first_is_in_flight_is_refused(world):
    async def main():
        # In flight once the plugin has its input (a fixed sleep lost this race under load).
        async with a_request_in_flight(world) as client:
            with pytest.raises(ProviderOutcomeUnknown, match="still being requested"):
                await client.call("requestMachines", world.request("op-1", 1))

    trio.run(main)
    assert len(world.inputs("requestMachines")) == 1


def test_a_refused_request_leaves_nothing_and_may_be_tried_again(world, h):
    async def main():
        client = world.adapter()
        with pytest.raises(Exception) as caught:
            await client.call("requestMachines", world.request("op-1", 99))  # above maxNumber
        assert after_request_error(caught.value, LEGACY_FEATURES) is NextStep.FAILED
        assert "op-1" not in client.journal.creates
        out = await client.call("requestMachines", world.request("op-1", 1))
        return await h.settle(client, out["requestId"])

    assert trio.run(main)["status"] == "complete"


def test_get_return_requests_reports_a_reclaimed_machine(world, h):
    async def main():
        client = world.adapter()
        out = await client.call("requestMachines", world.request("op-1", 2))
        machines = (await h.settle(client, out["requestId"]))["machines"]
        first = await client.call("getReturnRequests", {"machines": []})
        world.settings({"RECLAIM_COUNT": 1, "RECLAIM_GRACE": 90})
        # The daemon passes no machines: the adapter still asks about every machine it knows.
        second = await client.call("getReturnRequests", {"machines": []})
        return machines, first, second

    machines, first, second = trio.run(main)
    assert first["requests"] == []
    (reclaim,) = second["requests"]
    oldest = min(machines, key=lambda m: (m["launchtime"], m["machineId"]))
    assert reclaim["machine"] == oldest["name"] and reclaim["machineId"] == oldest["machineId"]
    assert 0 < reclaim["gracePeriod"] <= 90
    asked = json.loads(world.inputs("getReturnRequests")[-1][1])
    assert sorted(m["machineId"] for m in asked["machines"]) == sorted(m["machineId"] for m in machines)
