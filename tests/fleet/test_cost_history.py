"""Spend over the whole history (``planner.cost.SpendFold``): folded from the facts in log order, it prices ended
and live machines as ``estimate`` does over an unpruned fold of the same facts, holding only the open machines."""

from __future__ import annotations

import random

import pytest

from provisionerd.domain.model import (
    NO_QUOTE,
    CommittedFact,
    Epoch,
    Fact,
    InstanceFact,
    Lost,
    OrphanAdopted,
    PriceQuote,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.planner.cost import SpendFold, estimate
from provisionerd.planner.fact_view import FactView, fold

E = Epoch(1, 1)
T0 = 1_800_000_000.0
QUOTES = [
    PriceQuote(0.5, "USD", "hour", "sim", "2026-01-01T00:00:00Z"),
    PriceQuote(2.0, "EUR", "hour", "sim", "2026-01-01T00:00:00Z"),
    PriceQuote(3.0, "USD", "month", "sim", "2026-01-01T00:00:00Z"),
    NO_QUOTE,
]


def history(seed: int, machines: int) -> list[CommittedFact]:
    """A random history of two providers: machines launched, some returned (with or without a time), some lost,
    a few adopted, the rest live; facts of different machines interleaved."""
    rng = random.Random(seed)
    made: list[Fact] = []
    open_: list[tuple[str, str]] = []
    t = T0
    for n in range(machines):
        provider, template = rng.choice(["aws", "gcp"]), rng.choice(["small", "big"])
        quote = rng.choice(QUOTES)
        op, ref, machine = f"op{n}", f"r{n}", f"m{n}"
        t += rng.uniform(0, 900)
        made.append(RequestIntent(provider, E, op, template, 1, (ref,), (f"h{n}",), "d", price=quote))
        if rng.random() < 0.05:
            made.append(OrphanAdopted(provider, E, f"ad{n}", machine, ref, "", ""))
        else:
            made.append(InstanceFact(provider, E, op, ref, machine, template, f"h{n}", launch_time=t, price=quote))
        open_.append((provider, machine))
        while open_ and rng.random() < 0.6:
            provider, gone = open_.pop(rng.randrange(len(open_)))
            t += rng.uniform(0, 3600)
            if rng.random() < 0.15:
                made.append(Lost(provider, E, f"l-{gone}", gone, "vanished"))
            else:
                made.append(ReturnIntent(provider, E, f"x-{gone}", (gone,), "idle"))
                made.append(Returned(provider, E, f"x-{gone}", (gone,), at=0.0 if rng.random() < 0.05 else t))
    return [CommittedFact(i + 1, f) for i, f in enumerate(made)]


@pytest.mark.parametrize("seed", range(8))
def test_the_fold_prices_the_history_as_an_unpruned_view_does(seed: int) -> None:
    facts = history(seed, 400)
    now = T0 + 400 * 900 + 10 * 3600.0
    spend = SpendFold()
    spend.add_all(facts)
    expected = estimate(fold(facts, FactView(prune=False)).machines.values(), now)
    assert spend.report(now) == expected
    assert expected.lines and expected.unpriced and expected.other_unit and expected.no_time  # each case occurs
    # The pruned view (the daemon's) prices only the live machines: the history is what it cannot see.
    live = estimate(fold(facts, FactView(prune=True)).machines.values(), now)
    assert sum(line.machines for line in live.lines) < sum(line.machines for line in expected.lines)
    # Only the open machines are held.
    assert spend.open_machines == sum(1 for m in fold(facts).machines.values() if m.state.live)


def test_a_page_read_twice_is_folded_once_and_the_report_is_repeatable() -> None:
    facts = history(1, 100)
    once, twice = SpendFold(), SpendFold()
    once.add_all(facts)
    twice.add_all(facts[:60])
    twice.add_all(facts[40:])  # overlapping pages
    assert once.report(T0 + 1e6) == twice.report(T0 + 1e6) == twice.report(T0 + 1e6)
    assert twice.facts == len(facts) and twice.last_index == facts[-1].index
    with pytest.raises(ValueError):
        once.report(float("nan"))


def test_a_machine_that_ended_long_ago_costs_what_it_cost_then() -> None:
    usd = QUOTES[0]
    facts = [
        CommittedFact(1, InstanceFact("aws", E, "op", "r", "old", "small", "h", launch_time=T0, price=usd)),
        CommittedFact(2, Returned("aws", E, "x", ("old",), at=T0 + 7200)),
        CommittedFact(3, InstanceFact("aws", E, "op2", "r2", "new", "small", "h2", launch_time=T0 + 1e6, price=usd)),
    ]
    spend = SpendFold()
    spend.add_all(facts)
    report = spend.report(T0 + 1e6 + 3600)
    assert report.totals() == {"USD": pytest.approx(0.5 * 2 + 0.5 * 1)}
    assert spend.open_machines == 1
