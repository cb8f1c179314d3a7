"""A provider that fails by configuration stops being asked (issue 17, item 5), through the real loop, gate, executor
and offer feed on MockClock.

Before: a provider answering ``auth_failed`` got 100 intents (100 fresh token sets) and 100 failure facts at t=0 and
again every minute, forever. Now the first failure makes it unhealthy: nothing is asked of it but one
``getAvailableTemplates`` probe per back-off step (30, 60, 120, 240 s ...), no token is minted and no intent is
committed, and the first probe that succeeds makes it healthy again, at which point its demand is requested.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, CLUSTER, item

from provisionerd.domain.errors import ProviderRejected
from provisionerd.domain.model import InstanceFact, RequestFailed, RequestIntent
from provisionerd.planner.policy import Policy, ProviderPolicy

BROKEN_FOR = 600.0  # ten virtual minutes of bad credentials


class BrokenCredentials(BootingProvider):
    """Answers every call with ``auth_failed`` until ``fixed_at`` (trio clock), then works."""

    def __init__(self, *args: Any, fixed_at: float, code: str = "auth_failed", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fixed_at = fixed_at
        self.code = code

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        if trio.current_time() < self.fixed_at:
            self.call_log.append((trio.current_time(), action))
            raise ProviderRejected(self.name, action, self.code, "AuthFailure: the access key id does not exist")
        return await super().call(action, input, timeout=timeout)


def demand(n: int, provider: str) -> list:
    return [item(f"{provider}-{i:03d}", 1, providers=(provider,)) for i in range(n)]


POLICY = Policy(
    cluster=CLUSTER,
    providers={
        "p": ProviderPolicy(join_deadline=5000.0, unhealthy_base=30.0, unhealthy_max=1800.0),
        "q": ProviderPolicy(join_deadline=5000.0),
    },
    step_limit=1000,
)


@pytest.mark.sweep
@pytest.mark.parametrize("broken_from", ["requests", "templates"])
def test_auth_failed_for_ten_minutes_costs_a_handful_of_calls_and_no_intent_after_the_first_failure(
    run_rig, broken_from
):
    """``requests``: the templates read worked at t=0, so the first requests fail (the measured case); ``templates``:
    the first templates read already fails, so not one request is ever made while the credentials are bad."""
    p = BrokenCredentials("p", {"small": 200}, launch_time=int(BASE), fixed_at=BROKEN_FOR)
    q = BootingProvider("q", {"small": 200}, launch_time=int(BASE))
    # Both fakes name machines "m-<n>"; the fact view keys machines by id alone, so q's ids are moved out of p's way.
    q._seq = itertools.count(100_000)
    seen: dict[str, Any] = {}

    async def scenario(rig, nursery):
        if broken_from == "requests":  # the feed read p before its credentials broke; they break now
            await rig.wait_for(lambda: rig.feed.fresh(["p", "q"]))
        rig.session.set_demand(1, *demand(100, "p"), *demand(10, "q"))
        await rig.wait_for(lambda: rig.loop.unhealthy("p"))
        seen["unhealthy_at"] = trio.current_time()
        # q's demand is served while p is unhealthy
        await rig.wait_for(lambda: sum(f.provider == "q" for f in rig.facts(InstanceFact)) == 10)
        await trio.sleep_until(BROKEN_FOR - 1.0)
        seen["intents_while_broken"] = [f for f in rig.facts(RequestIntent) if f.provider == "p"]
        seen["failed_while_broken"] = [f for f in rig.facts(RequestFailed) if f.provider == "p"]
        seen["health"] = rig.loop.provider_health()
        seen["calls_while_broken"] = list(p.call_log)
        await rig.wait_for(lambda: sum(f.provider == "p" for f in rig.facts(InstanceFact)) == 100)
        seen["recovered_at"] = trio.current_time()
        seen["health_after"] = rig.loop.provider_health()

    if broken_from == "templates":
        p.fixed_at = BROKEN_FOR
    else:
        p.fixed_at = -1.0  # works for the first templates read; broken from the first request on

        original = p.call

        async def break_on_first_request(action, input, *, timeout=None):
            if action == "requestMachines" and p.fixed_at < 0:
                p.fixed_at = BROKEN_FOR
            return await original(action, input, timeout=timeout)

        p.call = break_on_first_request
    rig = run_rig(scenario, {"p": p, "q": q}, policy=POLICY)

    intents = seen["intents_while_broken"]
    calls = seen["calls_while_broken"]
    probes = [t for t, action in calls if action == "getAvailableTemplates"]
    if broken_from == "templates":
        assert intents == []  # not one token minted, not one intent committed
        assert probes[0] == 0.0
    else:
        # The requests planned in the first cycle before the first failure came back; none after it.
        first_failure = min(t for t, action in calls if action == "requestMachines")
        assert all(t == first_failure for t, action in calls if action == "requestMachines")
        assert len(intents) <= rig.loop.settings.max_concurrent
        assert len(seen["failed_while_broken"]) == len(intents)  # each one closed: nothing left to recover
    # One probe per back-off step (30, 60, 120, 240 s after the failure): 4 in ten minutes, nothing else.
    start = seen["unhealthy_at"]
    assert [round(t - start, 3) for t in probes if t > start] == [30.0, 90.0, 210.0, 450.0]
    assert {action for t, action in calls if t > start} == {"getAvailableTemplates"}
    assert len(calls) <= len(intents) + 5
    # Healthy again at the first probe after the credentials are fixed (the step after 450 s: 450 + 480 = 930 s).
    assert seen["recovered_at"] == pytest.approx(start + 930.0, abs=5.0)
    # What `provisionerd status` shows (its reconcile.provider_health part) while the credentials are bad.
    health = seen["health"]
    assert health["q"] == {"state": "healthy"}
    assert health["p"]["state"] == "unhealthy" and health["p"]["code"] == "auth_failed"
    assert "AuthFailure" in health["p"]["detail"] and health["p"]["returns_wait"] is True
    assert health["p"]["failures"] == 5  # the failure and four probes
    assert health["p"]["next_probe_in_s"] == pytest.approx(start + 930.0 - (BROKEN_FOR - 1.0), abs=1e-3)
    assert seen["health_after"]["p"] == {"state": "healthy"}
    (unhealthy, *again) = rig.events_of("provider_unhealthy", provider="p")
    assert unhealthy["code"] == "auth_failed" and "AuthFailure" in unhealthy["detail"]
    assert unhealthy["next_probe_in"] == pytest.approx(30.0)
    assert again == []  # the failed probes are the steps, not new events
    (healthy,) = rig.events_of("provider_healthy", provider="p")
    assert "probe succeeded" in healthy["detail"]
    assert not rig.events_of("provider_unhealthy", provider="q")
