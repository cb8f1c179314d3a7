"""The legacy example under the daemon's real executor (lease keeper, mutation gate, fact log of a fake controller),
on the real clock: request -> status -> instance facts whose token hashes match what each machine booted with;
a silent shortfall -> a partial outcome and RequestFailed (the planner re-plans it); a timed-out request -> an
unknown outcome with no second attempt reaching the plugin; a lying return -> not recorded as returned; a restart
-> the open intent recovered from the journal."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from provisionerd.config.loader import Backoff
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.model import InstanceFact, RequestFailed, RequestIntent, Returned
from provisionerd.domain.tokens import token_hash
from provisionerd.execution.executor import Executor, ExecutorSettings
from provisionerd.execution.gate import MutationGate
from provisionerd.provider.client import PluginClient
from provisionerd.provider.legacy.adapter import LegacyProvider
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_controller import FakeController

pytestmark = pytest.mark.process
TOKEN_TEMPLATE = {"PROVISIONERD_JOIN_TOKEN": "{join_token}", "PROVISIONERD_CONTROLLERS": "{controllers}"}


async def with_executor(
    adapter: LegacyProvider, body: Any, events: EventLog | None = None
) -> tuple[Any, FakeController]:
    events = events if events is not None else EventLog(keep=10_000)
    controller = FakeController(ttl=30.0, grace=0.0)
    link = controller.link("prov-a")
    keeper = LeaseKeeper(
        "lsfex", link, margin=2.0, backoff=Backoff(initial=0.1, max=1.0), rng=random.Random(7), events=events
    )
    gate = MutationGate({"lsfex": keeper}, link, events)
    settings = ExecutorSettings(
        cluster="c1",
        controllers=("10.0.0.5:7700",),
        poll_initial=0.05,
        poll_max=0.2,
        provisioning_timeout=30.0,
        return_timeout=30.0,
        retries=2,
        retry_delay=0.01,
    )
    executor = Executor(settings, {"lsfex": PluginClient(adapter)}, gate, {"lsfex": keeper}, link, events)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            await keeper.wait_valid()
            result = await body(executor)
            nursery.cancel_scope.cancel()
    return result, controller


def facts(controller: FakeController, kind: type) -> list[Any]:
    return [c.fact for c in controller.facts if isinstance(c.fact, kind)]


def test_request_status_join_material_and_return(world):
    async def body(executor):
        outcome = await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 2, "d1"))
        back = await executor.return_machines("lsfex", "op-2", outcome.machine_ids[:1], "idle")
        return outcome, back

    (outcome, back), controller = trio.run(with_executor, world.adapter(TOKEN_TEMPLATE), body)
    assert outcome.status == "fulfilled" and len(outcome.machine_ids) == 2
    (intent,) = facts(controller, RequestIntent)
    instances = facts(controller, InstanceFact)
    assert sorted(f.instance_ref for f in instances) == sorted(intent.instance_refs)
    for fact in instances:
        # The machine booted with the token whose hash the fact carries: its worker's join proves it is this one.
        booted = world.user_data_of(fact.machine_id)
        assert token_hash(booted["PROVISIONERD_JOIN_TOKEN"]) == fact.token_hash
        assert booted["PROVISIONERD_CONTROLLERS"] == "10.0.0.5:7700"
    assert back.status == "returned" and facts(controller, Returned)[0].machine_ids == outcome.machine_ids[:1]


def test_a_silent_shortfall_becomes_a_partial_outcome(world):
    world.settings({"SHORT_FILL": 1})

    async def body(executor):
        return await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 3, "d1"))

    outcome, controller = trio.run(with_executor, world.adapter(), body)
    assert outcome.status == "partial" and len(outcome.machine_ids) == 2
    (failed,) = facts(controller, RequestFailed)
    assert "2 of 3" in failed.reason  # the intent ends with a shortfall of one: the planner asks again


def test_a_timed_out_request_is_not_retried_into_duplicates(world):
    world.settings({"SLOW_REQUEST_SECONDS": 60})
    adapter = world.adapter(timeouts={"requestMachines": 1.0})

    async def body(executor):
        return await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 2, "d1"))

    events = EventLog(keep=10_000)
    outcome, controller = trio.run(with_executor, adapter, body, events)
    assert (outcome.status, outcome.code) == ("unknown", "outcome_unknown")
    assert len(world.inputs("requestMachines")) == 1  # never retried
    assert len(world.plugin_state()["machines"]) == 2  # what the one attempt made, and no more
    assert facts(controller, InstanceFact) == []  # invisible: no listing can find them
    assert [u["op_id"] for u in adapter.unknown_outcomes()] == ["op-1"]
    # Recorded as unknown (the planner re-plans the shortfall as a new op), saying why; nothing was listed.
    (failed,) = facts(controller, RequestFailed)
    assert failed.op_id == "op-1" and failed.reason.startswith("outcome unknown: ProviderTimeout")
    assert "not retried" in failed.reason
    (event,) = events.of_kind("request_outcome_unknown")
    assert event["op_id"] == "op-1" and event["retried"] is False and event["error"] == "ProviderTimeout"
    assert events.of_kind("action") and not [e for e in events.of_kind("action") if e["phase"] == "recovery"]


def test_a_request_without_a_requestid_after_a_restart_is_recorded_as_unknown(world):
    world.settings({"SLOW_REQUEST_SECONDS": 60})

    async def body(executor):
        return await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 1, "d1"))

    _, controller = trio.run(with_executor, world.adapter(timeouts={"requestMachines": 1.0}), body)
    (intent,) = facts(controller, RequestIntent)

    async def recover(executor):
        return await executor.recover_request(intent)

    # A new process over the same journal: the op's call is known to be unknown, so no listing is even tried.
    recovered, again = trio.run(with_executor, world.adapter(), recover)
    assert (recovered.status, recovered.code) == ("unknown", "outcome_unknown")
    (failed,) = facts(again, RequestFailed)
    assert "found after a restart" in failed.reason and len(world.inputs("requestMachines")) == 1
    assert world.inputs("getRequestStatus") == []


def test_a_return_that_lies_is_not_recorded_as_returned(world):
    async def body(executor):
        outcome = await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 1, "d1"))
        world.settings({"STICKY_RETURN": True})
        return await executor.return_machines("lsfex", "op-2", outcome.machine_ids, "idle")

    back, controller = trio.run(with_executor, world.adapter(), body)
    assert back.status == "partial" and back.returned == ()
    assert facts(controller, Returned) == []


def test_an_open_intent_is_recovered_from_the_journal_after_a_restart(world):
    async def body(executor):
        outcome = await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 2, "d1"))
        return outcome

    first, controller = trio.run(with_executor, world.adapter(), body)
    (intent,) = facts(controller, RequestIntent)

    async def recover(executor):
        return await executor.recover_request(intent)

    # A new daemon process: a fresh adapter over the same journal, asked to settle the intent from the facts.
    recovered, _ = trio.run(with_executor, world.adapter(), recover)
    assert recovered.status == "fulfilled"
    assert sorted(recovered.machine_ids) == sorted(first.machine_ids)
    assert len(world.inputs("requestMachines")) == 1


def test_a_requestid_printed_before_a_hang_is_polled_not_retried(world):
    world.settings({"SLOW_REQUEST_SECONDS": 60, "SLOW_REQUEST_PHASE": "after_answer"})

    async def body(executor):
        return await executor.request(RequestMachines("op-1", "lsfex", "lsfex-small", 2, "d1"))

    outcome, controller = trio.run(with_executor, world.adapter(timeouts={"requestMachines": 1.0}), body)
    assert outcome.status == "fulfilled" and len(outcome.machine_ids) == 2  # through status polling
    assert len(world.inputs("requestMachines")) == 1 and facts(controller, RequestFailed) == []
