"""Typed provider failures on MockClock: throttle back-off, capacity fall-over, quota pause, unknown outcomes."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, item

from provisionerd.domain.errors import ProviderCrashed, ProviderRejected, ProviderTimeout
from provisionerd.domain.model import TAG_OP, InstanceFact, RequestFailed, RequestIntent


def request_times(provider: BootingProvider) -> list[float]:
    return [t for t, action in provider.call_log if action == "requestMachines"]


def demand_after_a_failure(run_rig, failure: Exception, count: int):
    """The rig after demand ``count`` on a provider whose first ``requestMachines`` fails with ``failure``, run until
    ``count`` instance facts are committed."""
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    provider.fail_next("requestMachines", failure)

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", count))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == count)

    return run_rig(scenario, {"p": provider})


def test_throttled_requests_back_off_exponentially_with_jitter(run_rig):
    seen: dict = {}

    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    for _ in range(3):
        provider.fail_next("requestMachines", ProviderRejected("p", "requestMachines", "throttled", "slow down"))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        windows = []
        for _ in range(3):
            n = len(rig.facts(RequestFailed))
            await rig.wait_for(lambda n=n: len(rig.facts(RequestFailed)) > n)
            await trio.lowlevel.checkpoint()
            windows.append(rig.loop.state.capacity.throttles["p"].until - BASE)
        await rig.wait_for(lambda: rig.facts(InstanceFact))
        seen.update(windows=windows)

    rig = run_rig(scenario, {"p": provider})
    windows = seen["windows"]
    times = request_times(rig.providers["p"])
    assert len(times) == 4 and times[0] == 0.0
    # Each retry starts the instant the back-off window of the throttle before it ends...
    assert times[1:] == pytest.approx(windows, abs=1e-5)
    # ...and the n-th window lasts between half and all of base * 2**(n-1) (base 2 s, jittered).
    for n, (start, end) in enumerate(zip(times, windows, strict=False), 1):
        assert 2.0 * 2 ** (n - 1) * 0.5 <= end - start <= 2.0 * 2 ** (n - 1)
    assert [f.reason for f in rig.facts(RequestFailed)] == ["throttled"] * 3
    assert len(rig.running()) == 1
    assert "p" not in rig.loop.state.capacity.throttles  # the success reset the back-off


def test_capacity_unavailable_falls_over_to_the_next_offer_at_once(run_rig):
    seen: dict = {}

    provider = BootingProvider(
        "p", {"cheap": 10, "dear": 10}, prices={"cheap": 0.1, "dear": 0.5}, launch_time=int(BASE)
    )
    provider.fail_next("requestMachines", ProviderRejected("p", "requestMachines", "capacity_unavailable", "none"))

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 2))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 2)
        seen["filled_at"] = trio.current_time()
        # More demand within the 180 s back-off still goes to the dear offer; after it, to the cheap one again.
        rig.session.set_demand(2, item("d", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)
        await trio.sleep(200)
        rig.session.set_demand(3, item("d", 4))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 4)

    rig = run_rig(scenario, {"p": provider})
    asked = [doc["template"]["templateId"] for _, doc in rig.calls("p", "requestMachines")]
    assert asked == ["cheap", "dear", "dear", "cheap"]
    assert request_times(rig.providers["p"])[:2] == [0.0, 0.0]  # the fall-over is the very next plan
    assert seen["filled_at"] == 1.0  # the first status poll
    assert rig.facts(RequestFailed)[0].reason == "capacity_unavailable"
    notes = rig.events_of("plan_note", kind="offer_unavailable")
    assert notes and "p/cheap" in notes[0]["detail"]


def test_quota_exceeded_makes_the_provider_unhealthy_until_a_probe_and_raises_events(run_rig):
    quota = ProviderRejected("p", "requestMachines", "quota_exceeded", "vCPU limit")
    rig = demand_after_a_failure(run_rig, quota, 1)
    times = request_times(rig.providers["p"])
    assert times[0] == 0.0
    assert times[1] == pytest.approx(rig.policy.quota_pause, abs=1e-5)  # unhealthy 900 s, probed, tried again
    assert len(times) == 2
    (event,) = rig.events_of("provider_unhealthy")
    assert event["provider"] == "p" and event["code"] == "quota_exceeded" and "vCPU limit" in event["detail"]
    assert event["next_probe_in"] == pytest.approx(rig.policy.quota_pause, abs=1e-5)
    (healthy,) = rig.events_of("provider_healthy")
    assert healthy["provider"] == "p" and "probe succeeded" in healthy["detail"]
    # The probe was one getAvailableTemplates read at 900 s, between the two requests.
    reads = [t for t, action in rig.providers["p"].call_log if action == "getAvailableTemplates"]
    assert [t for t in reads if 0.0 < t < times[1] + 1e-6] == [pytest.approx(times[1], abs=1e-5)]


def test_a_crash_after_the_effect_lists_by_op_and_settles_from_the_listing_without_calling_again(run_rig):
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    provider.crash_after_effect = 1

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 3))
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 3)
        await trio.sleep(60)

    rig = run_rig(scenario, {"p": provider})
    provider = rig.providers["p"]
    actions = [action for _, action in provider.call_log if action != "getAvailableTemplates"]
    # The listing shows every machine of the op: they are committed, and requestMachines is not called again.
    assert actions[:2] == ["requestMachines", "listMachines"]
    # Recovery never asks the features: describeProvider is only the reclaim poll's one read (reclaimsByTags?).
    described = [n for n, action in enumerate(actions) if action == "describeProvider"]
    assert described in ([], [actions.index("getReturnRequests") - 1]), actions
    (first,) = (doc for _, doc in rig.calls("p", "requestMachines"))
    (listing,) = (doc for _, doc in rig.calls("p", "listMachines"))
    assert listing["tags"][TAG_OP] == first["op_id"]
    assert len(rig.running()) == 3 and len(provider.requests) == 1  # no duplicate machines
    assert len(rig.facts(RequestIntent)) == 1 and not rig.facts(RequestFailed)
    recovery = rig.events_of("action", phase="recovery")
    assert recovery[0]["error"] == "ProviderCrashed" and recovery[0]["found"] == 3


def test_a_timeout_before_any_effect_retries_the_same_op_once(run_rig):
    rig = demand_after_a_failure(run_rig, ProviderTimeout("p", "requestMachines", "no answer in 180 s"), 2)
    ops = {doc["op_id"] for _, doc in rig.calls("p", "requestMachines")}
    assert len(ops) == 1 and len(rig.calls("p", "requestMachines")) == 2
    assert rig.events_of("action", phase="recovery")[0]["found"] == 0
    assert len(rig.running()) == 2


def test_provider_error_with_nothing_made_is_a_refusal(run_rig):
    rig = demand_after_a_failure(run_rig, ProviderRejected("p", "requestMachines", "provider_error", "API 500"), 1)
    failed = rig.facts(RequestFailed)
    assert [f.reason for f in failed] == ["provider_error"]
    ops = [doc["op_id"] for _, doc in rig.calls("p", "requestMachines")]
    assert len(ops) == 2 and ops[0] != ops[1]  # refused, so the planner asked again under a new op
    assert len(rig.running()) == 1


def test_an_unexpected_error_in_one_action_does_not_stop_the_loop(run_rig):
    provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
    provider.fail_next("requestMachines", RuntimeError("a bug in a plugin client"))  # type: ignore[arg-type]

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 1))
        await rig.wait_for(lambda: rig.facts(InstanceFact), limit=2000)

    rig = run_rig(scenario, {"p": provider})
    (crash,) = rig.events_of("action", phase="crashed")
    assert crash["error"] == "RuntimeError"
    assert len(rig.running()) == 1  # the intent of the crashed action was left to the loop's recovery


class RetryRefused(BootingProvider):
    """The first ``requestMachines`` makes its machines and crashes; the second (the retry) is refused; every
    ``listMachines`` fails while ``listing_broken``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.crash_after_effect = 1
        self.listing_broken = True
        self.requests_seen = 0

    async def call(self, action, input, *, timeout=None):
        if action == "listMachines" and self.listing_broken:
            self.call_log.append((trio.current_time(), action))
            raise ProviderCrashed(self.name, action, "output is not JSON")
        if action == "requestMachines":
            self.requests_seen += 1
            if self.requests_seen == 2:
                self.call_log.append((trio.current_time(), action))
                raise ProviderRejected(self.name, action, "capacity_unavailable", "none left")
        return await super().call(action, input, timeout=timeout)


def test_a_retry_refused_after_an_unknown_outcome_with_no_listing_leaves_the_op_open_not_failed(run_rig):
    """The first call made the machines and crashed; the listing fails; the retry (same op_id) is refused. The
    refusal says nothing about what the first call made, so no ``RequestFailed``: the intent stays open, and
    recovery's later listing records the machines (seed 859785291: they ran with no fact)."""
    provider = RetryRefused("p", {"small": 10}, launch_time=int(BASE))
    seen = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d", 2))
        await rig.wait_for(lambda: provider.requests_seen >= 2)
        await trio.sleep(5)
        seen["failed_after_refusal"] = list(rig.facts(RequestFailed))
        provider.listing_broken = False
        await rig.wait_for(lambda: len(rig.facts(InstanceFact)) == 2, limit=600.0)

    rig = run_rig(scenario, {"p": provider})
    assert seen["failed_after_refusal"] == []
    assert len({doc["op_id"] for _, doc in rig.calls("p", "requestMachines")}) == 1  # no new op while unknown
    made = {m for m, doc in provider.machines.items() if doc["status"] != "terminated"}
    assert {f.machine_id for f in rig.facts(InstanceFact)} == made and len(made) == 2
