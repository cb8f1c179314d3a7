"""Paging: order kept, nothing lost, numbering right, and every page far below the frame limit."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import committed, demand_items, hosts

from provisionerd.domain import model
from provisionerd.wire import codec, paging
from provisionerd.wire import messages as m
from provisionerd.wire.framing import DEFAULT_MAX_FRAME


@given(st.lists(st.integers(), max_size=50), st.integers(1, 12))
def test_paginate_keeps_order_and_sizes(items, per_page):
    pages = paging.paginate(items, per_page)
    assert [x for page in pages for x in page] == items
    assert all(1 <= len(p) <= per_page for p in pages) or pages == [()]
    assert len(pages) == max(1, -(-len(items) // per_page))


def test_paginate_rejects_a_zero_page_size():
    with pytest.raises(ValueError):
        paging.paginate([1], 0)


@given(st.lists(demand_items, max_size=20), st.integers(1, 6), st.integers(0, 2**64 - 1))
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
def test_demand_pages_number_a_snapshot_and_lose_nothing(items, per_page, seq):
    pages = paging.demand_pages(seq, items, max_items=per_page)
    assert [(p.snapshot_seq, p.page, p.page_count) for p in pages] == [(seq, i, len(pages)) for i in range(len(pages))]
    assert [i for p in pages for i in p.items] == items


def test_no_demand_is_one_empty_page():
    assert paging.demand_pages(9, []) == [m.DemandPage(9, 0, 1, ())]


def _fat_item(i: int, size: int) -> model.DemandItem:
    return model.DemandItem(f"d{i}", model.ResourceShape(attributes={"blob": "x" * size}), 1)


def test_big_items_split_by_bytes_and_every_page_stays_under_the_budget():
    # 2000 items of ~3 KiB = ~6 MiB of demand: six times the frame limit.
    items = [_fat_item(i, 3000) for i in range(2000)]
    pages = paging.demand_pages(1, items)
    sizes = [len(codec.encode(p, corr=2**64 - 1)) for p in pages]
    assert max(sizes) <= paging.PAGE_BYTES < DEFAULT_MAX_FRAME
    assert [i for p in pages for i in p.items] == items
    assert len(pages) >= 6 * 4


def test_mixed_sizes_split_only_where_needed():
    items = [_fat_item(0, 200_000), *(_fat_item(i, 10) for i in range(1, 5)), _fat_item(5, 200_000)]
    pages = paging.demand_pages(1, items, max_bytes=250_000)
    assert all(len(codec.encode(p)) <= 250_000 for p in pages)
    assert [i for p in pages for i in p.items] == items


def test_an_item_too_big_for_any_page_is_refused():
    with pytest.raises(ValueError, match="above"):
        paging.demand_pages(1, [_fat_item(0, 5000)], max_bytes=4096)


@given(st.lists(committed, max_size=12), st.lists(hosts, max_size=12), st.integers(1, 5))
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
def test_resync_pages_carry_facts_in_log_order_then_hosts(facts, host_states, per_page):
    pages = paging.resync_pages(facts, host_states, max_items=per_page)
    assert [(p.page, p.page_count) for p in pages] == [(i, len(pages)) for i in range(len(pages))]
    assert [f for p in pages for f in p.facts] == facts
    assert [h for p in pages for h in p.hosts] == host_states
    assert all(len(p.facts) + len(p.hosts) <= per_page for p in pages)


@given(st.lists(hosts, max_size=12), st.integers(1, 5))
def test_host_pushes_lose_nothing(host_states, per_page):
    pushes = paging.host_pushes(host_states, max_items=per_page)
    assert [h for p in pushes for h in p.hosts] == host_states
