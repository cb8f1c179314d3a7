"""Join tokens and the offer feed."""

from __future__ import annotations

import hashlib

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


def test_a_failed_read_drops_that_providers_offers_until_the_next_good_one():
    async def main():
        good, flaky = FakeProvider("good", {"g": 1}), FakeProvider("flaky", {"f": 1})
        feed = OfferFeed({"good": PluginClient(good), "flaky": PluginClient(flaky)}, EventLog(), interval=60.0)
        await feed.refresh()
        assert {k for k in feed.catalog.by_key} == {("good", "g"), ("flaky", "f")}
        assert feed.fresh(["good", "flaky"])
        flaky.fail_next("getAvailableTemplates", ProviderRejected("flaky", "getAvailableTemplates", "throttled", "x"))
        failures = await feed.refresh()
        assert set(failures) == {"flaky"} and failures["flaky"].code == "throttled"
        assert {k for k in feed.catalog.by_key} == {("good", "g")}
        assert feed.fresh(["good"]) and not feed.fresh(["flaky"])
        await trio.sleep(181)  # max_age is 3 intervals
        assert not feed.fresh(["good"])
        await feed.refresh()
        assert feed.fresh(["good", "flaky"])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
