"""Offer compatibility (one function that also explains) and the cheapest-offer choice."""

import math

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import fuzz_settings, item, offer

from provisionerd.domain.model import DemandItem, Offer, PriceQuote, ResourceShape
from provisionerd.planner.offers import Catalog, choose_offer, compatibility_reasons, offer_key


def test_compatible_offer_has_no_reasons():
    assert compatibility_reasons(item(ncpus=4, mem_mb=8192, arch="x86_64"), offer()) == ()
    assert compatibility_reasons(ResourceShape(ncpus=2), offer()) == ()


def test_each_shape_field_is_checked_and_explained():
    shape_item = item(ncpus=8, mem_mb=16384, gpus=2, gpu_type="A100", arch="aarch64", attributes={"zone": "a"})
    reasons = compatibility_reasons(shape_item, offer(ncpus=4, mem=8192, gpus=1, gputype="T4", zone="b"))
    assert reasons == (
        "ncpus 4 < 8 required",
        "mem 8192 MiB < 16384 MiB required",
        "ngpus 1 < 2 required",
        "gputype 't4' != 'a100' required",
        "type (arch) 'x86_64' != 'aarch64' required",
        "attribute zone 'b' != 'a' required",
    )


def test_undeclared_attributes():
    bare = Offer("p", "bare", 10)
    assert compatibility_reasons(item(ncpus=1), bare) == ()  # every machine has one CPU
    assert compatibility_reasons(item(ncpus=2, mem_mb=1, gpus=1, arch="x86_64", attributes={"zone": "a"}), bare) == (
        "ncpus 1 < 2 required",
        "mem undeclared < 1 MiB required",
        "ngpus 0 < 1 required",
        "type (arch) None != 'x86_64' required",
        "attribute zone undeclared ('a' required)",
    )


def test_unreadable_numeric_attribute_is_a_reason():
    broken = Offer("p", "x", 1, {"ncpus": ("Numeric", "many"), "mem": ("Numeric", "nan")})
    reasons = compatibility_reasons(item(), broken)
    assert "ncpus value ('Numeric', 'many') is not a number" in reasons
    assert "mem value 'nan' is not finite" in reasons


def test_provider_restriction_and_placement():
    assert compatibility_reasons(item(providers=["q"]), offer(provider="p")) == (
        "provider 'p' not in allowed providers ['q']",
    )
    placed = item()
    placed = placed.__class__(placed.demand_id, placed.shape, 1, placement={"rack": "r1"})
    assert compatibility_reasons(placed, offer(rack="r2")) == ("placement rack 'r2' != 'r1' required",)
    assert compatibility_reasons(placed, offer(rack="r1")) == ()


def test_cost_cap_rejects_unpriced_and_too_expensive_offers():
    assert compatibility_reasons(item(cap=1.0), offer(price=None)) == ("unpriced offer rejected under cost cap 1/hour",)
    assert compatibility_reasons(item(cap=1.0), offer(price=1.5)) == ("price 1.5/hour above cost cap 1/hour",)
    assert compatibility_reasons(item(cap=1.0), offer(price=1.0)) == ()
    assert compatibility_reasons(item(), offer(price=None)) == ()  # no cap: price never rejects
    monthly = Offer("p", "m", 1, {}, PriceQuote(5.0, "USD", "month", "s", "t"))
    assert compatibility_reasons(item(cap=10.0), monthly) == (
        "unusable price quote 5.0/month offer rejected under cost cap 10/hour",
    )
    assert compatibility_reasons(item(cap=math.nan), offer()) == ("cost cap nan is not a finite non-negative number",)


def test_cheapest_wins_ties_on_offer_id_unpriced_last():
    offers = [
        offer("q", "b", price=0.2),
        offer("p", "z", price=None),
        offer("p", "b", price=0.2),
        offer("q", "a", price=None),
        offer("p", "c", price=0.3),
    ]
    choice = choose_offer(item(), offers)
    assert [offer_key(o) for o in choice.eligible] == [("p", "b"), ("q", "b"), ("p", "c"), ("p", "z"), ("q", "a")]
    assert offer_key(choice.chosen) == ("p", "b")
    assert choice.rejected == ()


def test_unavailable_offer_falls_to_the_next_and_is_reported():
    offers = [offer("p", "cheap", price=0.1), offer("p", "dear", price=0.9), offer("p", "tiny", ncpus=1)]
    choice = choose_offer(item(ncpus=2), offers, {("p", "cheap"): "capacity_unavailable until 5"})
    assert offer_key(choice.chosen) == ("p", "dear")
    assert [(r.template_id, r.reasons) for r in choice.rejected] == [
        ("cheap", ("capacity_unavailable until 5",)),
        ("tiny", ("ncpus 1 < 2 required",)),
    ]
    assert "rejected p/tiny: ncpus 1 < 2 required" in choice.describe()
    nothing = choose_offer(item(ncpus=64), offers)
    assert nothing.chosen is None and len(nothing.rejected) == 3
    assert nothing.describe().startswith("demand d: none eligible")


def test_catalog_keeps_the_first_duplicate_and_caches_rankings():
    catalog = Catalog([offer("p", "t", price=0.1), offer("p", "t", price=0.01)])
    assert catalog.duplicates == (("p", "t"),)
    assert catalog.by_key[("p", "t")].price == 0.1
    req = choose_offer(item(), catalog)
    assert req.chosen.price.amount == 0.1


offers_st = st.lists(
    st.builds(
        offer,
        provider=st.sampled_from(["p", "q", "r"]),
        template=st.sampled_from(["t1", "t2", "t3", "t4"]),
        ncpus=st.integers(1, 8),
        mem=st.integers(0, 4).map(lambda x: x * 1024),
        gpus=st.integers(0, 2),
        arch=st.sampled_from(["X86_64", "ARM64"]),
        price=st.none() | st.floats(0, 5, allow_nan=False),
    ),
    max_size=12,
)
items_st = st.builds(
    item,
    ncpus=st.integers(1, 8),
    mem_mb=st.integers(0, 4).map(lambda x: x * 1024),
    gpus=st.integers(0, 2),
    arch=st.none() | st.sampled_from(["x86_64", "arm64"]),
    cap=st.none() | st.floats(0, 5, allow_nan=False),
    providers=st.lists(st.sampled_from(["p", "q", "r"]), max_size=2),
)


@fuzz_settings(200)
@given(items_st, offers_st, st.sets(st.sampled_from([(p, t) for p in "pqr" for t in ("t1", "t2", "t3", "t4")])))
def test_choice_is_the_cheapest_eligible_and_every_other_offer_is_explained(demand, offers, blocked):
    unavailable = {k: "blocked" for k in blocked}
    choice = choose_offer(demand, offers, unavailable)
    catalog = Catalog(offers)
    distinct = list(catalog.by_key.values())
    eligible = [p for p in distinct if not compatibility_reasons(demand, p.offer) and p.key not in unavailable]
    assert [offer_key(o) for o in choice.eligible] == [p.key for p in sorted(eligible, key=_order)]
    if eligible:
        best = min(eligible, key=_order)
        assert choice.chosen is best.offer
        priced = [p.price for p in eligible if p.price is not None]
        if priced:  # never a more expensive eligible offer
            assert choice.chosen.price is not None and choice.chosen.price.amount == min(priced)
    else:
        assert choice.chosen is None
    rejected = {(r.provider, r.template_id): r.reasons for r in choice.rejected}
    assert set(rejected) | {offer_key(o) for o in choice.eligible} == set(catalog.by_key)
    for key, reasons in rejected.items():
        expected = compatibility_reasons(demand, catalog.by_key[key].offer) or ("blocked",)
        assert reasons == expected and reasons
    if demand.max_hourly_cost is not None:
        assert all(o.price is not None and o.price.amount <= demand.max_hourly_cost for o in choice.eligible)


def _order(parsed):
    return (parsed.price is None, parsed.price or 0.0, parsed.offer.provider, parsed.offer.template_id)


def _quoted(currency: str, unit: str = "hour") -> Offer:
    return Offer(
        "p", "t", 10, {"ncpus": ("Numeric", "4")}, PriceQuote(0.5, currency, unit, "t", "2026-01-01T00:00:00Z")
    )


def test_a_cost_cap_compares_like_with_like_and_refuses_another_currency() -> None:
    capped = attrs.evolve(DemandItem("d", ResourceShape(), 1), max_hourly_cost=1.0, cost_currency="usd")
    assert compatibility_reasons(capped, _quoted("USD")) == ()
    (why,) = compatibility_reasons(capped, _quoted("EUR"))
    assert "'EUR'" in why and "'USD'" in why
    (monthly,) = compatibility_reasons(capped, _quoted("USD", "month"))
    assert "unusable" in monthly
    unnamed = attrs.evolve(capped, cost_currency="")
    assert compatibility_reasons(unnamed, _quoted("EUR")) == ()  # no currency named: amounts alone, as before
