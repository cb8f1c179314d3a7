"""All-or-nothing demand items (issue 35 item 5), on the lifecycle rig (MockClock; the real lease keepers, gate,
executor, offer feed and reconcile loop against a fake controller and the in-memory provider).

An MPI job's item of 4 is asked of one offer in one request, never split across offers; a provider that answers it
in part has the machines it made returned (``all_or_nothing``) and the whole asked again after the offer's capacity
back-off; a provider whose plugin does not declare ``features.allOrNothing`` is never asked.
"""

from __future__ import annotations

from typing import Any

import trio
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.errors import ProviderCrashed
from provisionerd.domain.model import InstanceFact, RequestFailed, RequestIntent, ReturnIntent
from provisionerd.planner.policy import Policy, ProviderPolicy
from provisionerd.testing.fake_provider import FakeProvider

GANG = item("mpi", 4, all_or_nothing=True)


def provider(kind: type[FakeProvider] = FakeProvider) -> FakeProvider:
    """``small`` (room for 3, the cheaper) and ``large`` (room for 10): the cheapest offer cannot hold all 4."""
    prices = {"small": 0.5, "large": 1.0}
    return kind("p", {"small": 3, "large": 10}, launch_time=int(BASE), prices=prices)


class NoWholeRequests(FakeProvider):
    """A plugin that does not declare ``features.allOrNothing`` (as every plugin that predates it)."""

    def _describeProvider(self, doc: Any) -> dict[str, Any]:
        out = super()._describeProvider(doc)
        out["features"].pop("allOrNothing")
        return out


def policy() -> Policy:
    own = ProviderPolicy(idle_time=600.0, step_limit=2)  # a gang larger than the step goes into an empty window
    return Policy(
        cluster=CLUSTER, idle_time=600.0, join_deadline=900.0, provisioning_timeout=600.0, providers={"p": own}
    )


def test_an_all_or_nothing_item_is_asked_of_one_offer_in_one_request(run_rig):
    async def scenario(rig, nursery):
        rig.session.set_demand(1, GANG)
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 4)

    rig = run_rig(scenario, {"p": provider()}, policy=policy())
    (intent,) = rig.facts(RequestIntent)
    assert (intent.template_id, intent.count, intent.all_or_nothing) == ("large", 4, True)
    ((_, asked),) = rig.calls("p", "requestMachines")
    assert asked["allOrNothing"] is True and asked["template"]["machineCount"] == 4
    assert {m["template"] for m in rig.running()} == {"large"}


def test_the_same_item_without_the_flag_is_split_over_the_cheaper_offer_first(run_rig):
    """The contrast: the planner's ordinary fill takes the cheaper offer's 3, then 1 more elsewhere."""

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("mpi", 4))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 4, limit=120.0)

    rig = run_rig(scenario, {"p": provider()}, policy=policy())
    assert sorted((i.template_id, i.count) for i in rig.facts(RequestIntent)) == [
        ("large", 1),
        ("small", 1),
        ("small", 2),
    ]


def _gang_returned_then_asked_again(run_rig, plugin: FakeProvider) -> RequestFailed:
    """The scenario both partial outcomes share: the plugin makes 3 of the gang's 4; the rig waits for the return,
    reads the offer's block then, and waits for the whole to be asked again and to run. Checks what they share: the
    3 made are returned whole (``all_or_nothing``), after the offer's capacity back-off, and all 4 run from the
    second op. Returns the first op's ``RequestFailed``."""
    seen: dict[str, Any] = {}

    async def scenario(rig, nursery):
        rig.providers["p"].fall_short = 1
        rig.session.set_demand(1, GANG)
        await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) == 1, limit=120.0)
        seen["block"] = rig.loop.state.capacity.offer_block(("p", "large"), BASE + trio.current_time())
        await rig.wait_for(lambda: len(rig.facts(RequestIntent)) == 2, limit=600.0)
        await rig.wait_for(lambda: len(rig.running()) == 4, limit=120.0)
        seen["failed"] = rig.facts(RequestFailed)

    rig = run_rig(scenario, {"p": plugin}, policy=policy())
    first, second = rig.facts(RequestIntent)
    assert (first.count, second.count) == (4, 4) and first.all_or_nothing and second.all_or_nothing
    (failed,) = seen["failed"]
    assert failed.op_id == first.op_id
    (back,) = rig.facts(ReturnIntent)
    made_first = sorted(f.machine_id for f in rig.facts(InstanceFact) if f.op_id == first.op_id)
    assert back.reason == "all_or_nothing" and sorted(back.machine_ids) == made_first and len(made_first) == 3
    # The whole is asked again only after the offer's capacity back-off, and all 4 run from the second op.
    assert seen["block"] is not None and seen["block"].startswith("capacity_unavailable until"), seen["block"]
    assert {m["tags"]["provisionerd:op"] for m in rig.running()} == {second.op_id}
    return failed


def test_a_partial_answer_is_returned_whole_and_the_whole_is_asked_again(run_rig):
    """The cloud launches 3 of 4 and says complete_with_error."""
    failed = _gang_returned_then_asked_again(run_rig, provider())
    assert failed.reason.startswith("partial: 3 of 4"), failed.reason


class CrashesPartWay(FakeProvider):
    """A plugin without idempotent requests whose next all-or-nothing ``requestMachines`` launches all but
    ``fall_short`` machines and then dies before it answers (the outcome is unknown)."""

    def _describeProvider(self, doc: Any) -> dict[str, Any]:
        out = super()._describeProvider(doc)
        out["features"]["idempotentRequest"] = False
        return out

    def _requestMachines(self, doc: Any) -> dict[str, Any]:
        short = self.fall_short
        out = super()._requestMachines(doc)
        if short:
            raise ProviderCrashed(self.name, "requestMachines", "exited 1 before answering")
        return out


def test_an_unknown_outcome_that_made_part_of_the_gang_is_returned_and_asked_again_after_the_back_off(run_rig):
    """3 of 4 made, then the plugin dies before it answers: the listing shows the 3."""
    failed = _gang_returned_then_asked_again(run_rig, provider(CrashesPartWay))
    assert "outcome unknown (ProviderCrashed)" in failed.reason, failed.reason


def test_a_provider_that_cannot_say_all_or_nothing_is_never_asked(run_rig):
    seen: dict = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, GANG)
        await rig.wait_for(lambda: bool(rig.events_of("plan_note", kind="unmet_demand")), limit=120.0)
        seen["notes"] = [e["detail"] for e in rig.events_of("plan_note", kind="unmet_demand")]
        await trio.sleep(120.0)  # many passes: still nothing asked

    plugin = NoWholeRequests("p", {"large": 10}, launch_time=int(BASE))
    rig = run_rig(scenario, {"p": plugin}, policy=policy())
    assert rig.facts(RequestIntent) == [] and rig.calls("p", "requestMachines") == []
    assert any("cannot launch all or nothing" in note for note in seen["notes"]), seen["notes"]


def test_a_legacy_client_is_known_not_to_launch_all_or_nothing_without_being_asked():
    """The legacy LSF adapter knows its features without a call (all false): the book answers at once, and the
    planner's catalog never names it among the providers that launch all or nothing."""
    from provisionerd.execution.provider_features import FeatureBook
    from provisionerd.provider.legacy.rules import LEGACY_FEATURES
    from provisionerd.provider.values import Features

    class LegacyClient:
        known_features = Features.from_mapping(LEGACY_FEATURES)

        async def describe_provider(self, **_: Any) -> Any:
            raise AssertionError("a legacy plugin is never asked describeProvider")

    book = FeatureBook({"lsf": LegacyClient()})  # type: ignore[dict-item]
    known = book.known("lsf")
    assert known is not None and not known.all_or_nothing
    assert trio.run(book.read, "lsf") == known
