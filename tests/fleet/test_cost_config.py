"""``[cost]``: a cluster-wide cap compares like with like; the config check refuses one it cannot compare."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from rigs.daemon import parsed_config

from provisionerd.config.loader import Config
from provisionerd.daemon.builder import policy_from_config
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import DemandItem, DemandSnapshot, Offer, PriceQuote, ResourceShape
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.plan import plan
from provisionerd.planner.state import PlannerState

PROVIDERS = """
    [[providers]]
    name = "p"
    transport = "oneshot"
    path = "plugins/p"
"""


def config(tmp_path: Path, cost: str) -> Config:
    return parsed_config(tmp_path, textwrap.dedent(PROVIDERS) + textwrap.dedent(cost))


@pytest.mark.parametrize(
    ("cost", "words"),
    [
        ("[cost]\nmax_hourly_cost = 1.0\n", "currency"),  # a cap without its currency cannot be compared
        ('[cost]\ncurrency = "USD"\nunit = "month"\nmax_hourly_cost = 1.0\n', "unit"),
        ('[cost]\ncurrency = "dollars"\n', "currency"),
    ],
)
def test_a_cap_that_cannot_be_compared_with_quotes_is_a_config_error(tmp_path: Path, cost: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, cost)
    assert words in " ".join(caught.value.problems)


def quoted(template: str, currency: str, amount: float = 0.5) -> Offer:
    price = PriceQuote(amount, currency, "hour", "t", "2026-01-01T00:00:00Z")
    return Offer("p", template, 10, {"ncpus": ("Numeric", "4")}, price)


def test_the_cluster_cap_refuses_offers_in_another_currency_and_an_items_own_cap_wins(tmp_path: Path) -> None:
    policy = policy_from_config(config(tmp_path, '[cost]\ncurrency = "USD"\nmax_hourly_cost = 1.0\n'))
    assert (policy.cost_cap, policy.cost_currency) == (1.0, "USD")
    offers = [quoted("cheap-eur", "EUR", 0.1), quoted("usd", "USD", 0.5), quoted("dear-usd", "USD", 2.0)]

    def chosen(*items: DemandItem) -> set[str]:
        result = plan(PlannerState.initial("i0"), DemandSnapshot(1, items), FactView(), offers, {}, 1e9, policy)
        return {a.template_id for a in result.actions}  # type: ignore[attr-defined]

    assert chosen(DemandItem("d", ResourceShape(), 1)) == {"usd"}  # EUR is cheaper but never compared
    assert chosen(DemandItem("d", ResourceShape(), 1, max_hourly_cost=0.2, cost_currency="EUR")) == {"cheap-eur"}
