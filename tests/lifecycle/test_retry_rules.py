"""The executor's rules after an unknown ``requestMachines`` outcome, and the planner's back-off after the
controller refuses an intent (issue 9's executor findings: seeds 270, 44, 84, 293).

- every retry passes the gate as it starts: a lease that lapsed during the back-off stops it, and after a new
  epoch the intent is re-committed under that epoch before the call;
- a provider that does not declare ``idempotentRequest`` is never called twice with one op_id;
- ``IntentRefused`` backs the planner off (doubling, no escalation from actions already in flight).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, item

from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.errors import ProviderCrashed, ProviderTimeout
from provisionerd.domain.model import TAG_EPOCH, InstanceFact, RequestFailed, RequestIntent
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import (
    INTENT_BACKOFF_BASE,
    INTENT_BACKOFF_MAX,
    IntentRefused,
    PlannerState,
    observe,
)

CLUSTER = "testcluster"


class NoTokenProvider(BootingProvider):
    """A cloud without client tokens: ``describeProvider`` says so, and the same op_id creates machines again.
    ``first_makes`` machines come of the first request (the rest never do); it then crashes after the effect."""

    def __init__(self, *args: Any, first_makes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_makes: int | None = first_makes
        self.crash_after_effect = 1

    def _describeProvider(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._describeProvider(doc)
        out["features"]["idempotentRequest"] = False
        return out

    def _requestMachines(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        self.ops.pop(doc["op_id"], None)  # no client token: every call is a new request
        if self.first_makes is not None:
            n, self.first_makes = self.first_makes, None
            doc = dict(doc, bootstrap=doc["bootstrap"][:n], template=dict(doc["template"], machineCount=n))
        return super()._requestMachines(doc)


def test_a_cloud_without_client_tokens_is_never_called_twice_with_one_op_id(run_rig):
    provider = NoTokenProvider("p", {"small": 10}, launch_time=int(BASE), first_makes=1)

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)
        await trio.sleep(60)

    rig = run_rig(scenario, {"p": provider})
    ops = [doc["op_id"] for _, doc in rig.calls("p", "requestMachines")]
    assert len(ops) == len(set(ops)) == 2  # the crashed op, then the shortfall under a new op
    assert len(rig.calls("p", "describeProvider")) == 1  # asked once, then cached
    (failed,) = rig.facts(RequestFailed)
    assert failed.op_id == ops[0] and "not retried" in failed.reason and "1 of 3" in failed.reason
    assert [f.count for f in rig.facts(RequestIntent)] == [3, 2]
    assert len(rig.running()) == 3  # no machine made twice


def test_a_complete_listing_settles_the_op_without_a_second_call(run_rig):
    seen: dict = {}

    provider = NoTokenProvider("p", {"small": 10}, launch_time=int(BASE), first_makes=2)

    async def scenario(rig, nursery):
        seen["outcome"] = await rig.executor.request(RequestMachines("op-1", "p", "small", 2, "d"))

    rig = run_rig(scenario, {"p": provider}, loop=False)
    outcome = seen["outcome"]
    assert outcome.status == "fulfilled" and len(outcome.machine_ids) == 2
    assert len(rig.calls("p", "requestMachines")) == 1 and not rig.calls("p", "describeProvider")
    assert not rig.facts(RequestFailed)


def test_a_retry_whose_lease_lapsed_during_the_back_off_is_not_called(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    provider.fail_next("requestMachines", ProviderTimeout("p", "requestMachines", "no answer"))

    async def scenario(rig, nursery):

        async def partition_during_the_sleep():
            await trio.sleep(5.0)
            rig.link.partition()  # no renewal reaches the controller: the lease lapses before the retry

        nursery.start_soon(partition_during_the_sleep)
        seen["outcome"] = await rig.executor.request(RequestMachines("op-1", "p", "small", 2, "d"))

    rig = run_rig(scenario, {"p": provider}, executor_settings={"retry_delay": 60.0}, loop=False)
    outcome = seen["outcome"]
    assert outcome.status == "unknown"
    assert len(rig.calls("p", "requestMachines")) == 1  # the retry never reached the provider
    refused = [
        d for d in rig.gate.decisions if d.op_id == "op-1" and d.outcome != "admitted" and d.outcome != "finished"
    ]
    assert refused and refused[-1].at >= 60.0  # refused by the gate when the retry was due, not before


def test_a_retry_after_a_new_epoch_recommits_the_intent_under_it(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    provider.fail_next("requestMachines", ProviderCrashed("p", "requestMachines", "exit 70, no effect"))

    async def scenario(rig, nursery):
        keeper = rig.keepers["p"]

        async def new_epoch_during_the_sleep():
            await trio.sleep(2.0)
            keeper.invalidate(keeper.epoch, "test: the controller moved on")  # re-acquired: a new epoch
            await keeper.wait_valid()

        nursery.start_soon(new_epoch_during_the_sleep)
        seen["outcome"] = await rig.executor.request(RequestMachines("op-1", "p", "small", 2, "d"))

    rig = run_rig(scenario, {"p": provider}, executor_settings={"retry_delay": 10.0}, loop=False)
    outcome = seen["outcome"]
    assert outcome.status == "fulfilled"
    first, second = rig.facts(RequestIntent)
    assert first.op_id == second.op_id == "op-1" and second.epoch > first.epoch
    assert attrs_equal_but_epoch(first, second)
    calls = rig.calls("p", "requestMachines")
    assert [doc["tags"][TAG_EPOCH] for _, doc in calls] == [str(first.epoch), str(second.epoch)]
    assert calls[0][1]["bootstrap"] == calls[1][1]["bootstrap"]  # same op, same tokens
    view = rig.session.view.facts
    assert list(view.intents) == ["op-1"] and len(view.intents["op-1"].machine_ids) == 2  # one op in the fold
    assert not view.open_ops


def attrs_equal_but_epoch(a: RequestIntent, b: RequestIntent) -> bool:
    return attrs.evolve(a, epoch=b.epoch) == b


# --- the planner's back-off after a refused intent (pure) -------------------------------------------------------

POLICY = Policy(cluster=CLUSTER)


def test_refused_intents_back_off_doubling_without_escalating_on_actions_in_flight():
    state = PlannerState.initial("i1")
    assert state.intents_refused_until(BASE) is None
    state = observe(state, IntentRefused("p", "no_quorum", BASE), POLICY).state
    assert state.intents_refused_until(BASE) == BASE + INTENT_BACKOFF_BASE
    # Other actions refused inside the window were in flight when it opened: the window stays.
    same = observe(state, IntentRefused("p", "no_quorum", BASE + 0.5), POLICY).state
    assert same.intent_backoff == state.intent_backoff
    at = BASE + INTENT_BACKOFF_BASE
    for n in range(2, 10):
        observed = observe(state, IntentRefused("p", "not_primary", at), POLICY)
        state = observed.state
        expected = min(INTENT_BACKOFF_MAX, INTENT_BACKOFF_BASE * 2 ** (n - 1))
        assert state.intent_backoff.attempts == n
        assert state.intent_backoff.until == pytest.approx(at + expected)
        assert observed.notes[0].kind == "intents_refused"
        at = state.intent_backoff.until
    assert state.intents_refused_until(at) is None  # the window has ended
    # A refusal long after the last window starts over.
    later = observe(state, IntentRefused("p", "LinkDown", at + INTENT_BACKOFF_MAX + 1), POLICY).state
    assert later.intent_backoff.attempts == 1


def test_a_refused_intent_time_must_be_finite():
    with pytest.raises(ValueError):
        observe(PlannerState.initial("i1"), IntentRefused("p", "no_quorum", float("nan")), POLICY)
