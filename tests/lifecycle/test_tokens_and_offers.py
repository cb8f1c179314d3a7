"""Join tokens and the offer feed."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import trio
import trio.testing

from provisionerd.domain.errors import ProviderProtocolViolation, ProviderRejected
from provisionerd.domain.model import Offer, PriceQuote
from provisionerd.domain.tokens import instance_refs, issue, token_hash
from provisionerd.execution.offer_feed import MAX_TEMPLATES, OfferFeed, templates_to_offers
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider


def test_tokens_are_fresh_colon_free_and_kept_only_as_sha256():
    refs = instance_refs("c1:p:i1:7", 50)
    assert refs[0] == "c1:p:i1:7/0" and len(set(refs)) == 50
    issued = issue(refs)
    tokens = [t.token for t in issued]
    assert len(set(tokens)) == 50
    assert all(":" not in t and 16 <= len(t) <= 512 for t in tokens)
    assert all(t.hash == hashlib.sha256(t.token.encode()).hexdigest() == token_hash(t.token) for t in issued)
    assert all(t.token not in repr(t) for t in issued)  # logging an outcome never prints a token
    with pytest.raises(ValueError):
        instance_refs("op", 0)


def test_templates_become_offers_with_prices():
    document = {
        "templates": [
            {
                "templateId": "a",
                "maxNumber": 5,
                "attributes": {"ncpus": ["Numeric", "8"], "type": ["String", "X86_64"]},
                "price": {
                    "amount": 0.5,
                    "currency": "USD",
                    "unit": "hour",
                    "source": "list",
                    "timestamp": "2026-01-01T00:00:00Z",
                },
            },
            {"templateId": "b", "maxNumber": 0, "attributes": {}},
        ]
    }
    a, b = templates_to_offers("p", document)
    assert a == Offer(
        "p",
        "a",
        5,
        {"ncpus": ("Numeric", "8"), "type": ("String", "X86_64")},
        PriceQuote(0.5, "USD", "hour", "list", "2026-01-01T00:00:00Z"),
    )
    assert b == Offer("p", "b", 0, {}, None)


def test_unreadable_or_oversized_template_lists_are_typed_errors():
    with pytest.raises(ProviderProtocolViolation, match=r"at \$\.templates\[0\]: readable: key 'templateId'"):
        templates_to_offers("p", {"templates": [{"maxNumber": 1}]})
    with pytest.raises(ProviderProtocolViolation, match=r"at \$\.templates: maxItems"):
        templates_to_offers("p", {"templates": [{"templateId": "x", "maxNumber": 1}] * (MAX_TEMPLATES + 1)})


def test_a_failed_read_keeps_the_last_good_offers_and_says_they_age():
    """Issue 31 finding 5: a failed read used to drop the provider's offers, and every plan stopped until the next
    good read. The last good offers stay (``known``); ``fresh`` still says when they are older than max_age."""

    async def main():
        good, flaky = FakeProvider("good", {"g": 1}), FakeProvider("flaky", {"f": 1})
        feed = OfferFeed({"good": PluginClient(good), "flaky": PluginClient(flaky)}, EventLog(), interval=60.0)
        await feed.refresh()
        assert {k for k in feed.catalog.by_key} == {("good", "g"), ("flaky", "f")}
        assert feed.fresh(["good", "flaky"])
        flaky.fail_next("getAvailableTemplates", ProviderRejected("flaky", "getAvailableTemplates", "throttled", "x"))
        failures = await feed.refresh()
        assert set(failures) == {"flaky"} and failures["flaky"].code == "throttled"
        assert {k for k in feed.catalog.by_key} == {("good", "g"), ("flaky", "f")}  # kept
        assert feed.fresh(["good", "flaky"]) and feed.known(["flaky"])
        described = feed.describe("flaky")
        assert described["read"] and not described["stale"] and described["failures"] == 1
        assert described["error"] == "Throttled: throttled: x" and described["retry_in_s"] == 1.0
        assert feed.retry_in("flaky") == 1.0 and feed.retry_in("good") is None
        await trio.sleep(181)  # max_age is 3 intervals
        assert not feed.fresh(["good"]) and feed.known(["good", "flaky"])
        assert feed.describe("flaky")["stale"] is True
        await feed.refresh()
        assert feed.fresh(["good", "flaky"]) and "error" not in feed.describe("flaky")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_returns_go_on_while_offers_cannot_be_read_and_requests_stop_once_they_are_stale(run_rig):
    """Issue 31 finding 5: with every offers read failing, idle machines are still returned (the last good offers
    are kept, and a return needs none), and no new machine is requested once those offers are older than max_age
    (3 read intervals). Reads fail over and over: retried after 1, 2, 4 ... s, capped at the interval."""
    from lifecycle_fakes import BootingProvider
    from lifecycle_rig import BASE, item

    from provisionerd.domain.model import HostStatus, InstanceFact, RequestIntent, ReturnIntent
    from provisionerd.planner.policy import Policy

    p = BootingProvider("p", {"small": 20}, launch_time=int(BASE))
    seen: dict[str, Any] = {}

    async def scenario(rig, nursery):
        rig.session.set_demand(1, item("d1", 2))
        await rig.wait_for(lambda: len(rig.session.view.facts.machines) == 2)
        for fact in rig.facts(InstanceFact):
            rig.join(fact.machine_id, HostStatus.IDLE)
        broken_at = trio.current_time()
        for _ in range(100):
            p.fail_next(
                "getAvailableTemplates", ProviderRejected("p", "getAvailableTemplates", "provider_error", "down")
            )
        rig.session.set_demand(2)  # nothing wanted: both idle machines go after idle_time (60 s)
        await rig.wait_for(lambda: len(rig.facts(ReturnIntent)) >= 1)
        seen["returned_after"] = trio.current_time() - broken_at
        await trio.sleep_until(broken_at + 200)  # past max_age (180 s)
        seen["stale"] = rig.feed.describe("p")
        rig.session.set_demand(3, item("d2", 1))
        await trio.sleep(30)
        seen["intents"] = len(rig.facts(RequestIntent))
        seen["reads"] = [
            t - broken_at for t, action in p.call_log if action == "getAvailableTemplates" and t > broken_at
        ]

    policy = Policy(cluster="c1", provisioning_timeout=600.0, join_deadline=900.0, idle_time=60.0)
    run_rig(scenario, {"p": p}, policy=policy)
    assert seen["returned_after"] < 90.0, seen["returned_after"]
    assert seen["stale"]["stale"] is True and seen["stale"]["failures"] >= 5
    assert seen["intents"] == 1  # the first request only: nothing from offers 200 s old
    gaps = [b - a for a, b in zip(seen["reads"], seen["reads"][1:], strict=False)]
    assert gaps[:4] == pytest.approx([1.0, 2.0, 4.0, 8.0], abs=0.5) and max(gaps) <= 60.5, gaps
