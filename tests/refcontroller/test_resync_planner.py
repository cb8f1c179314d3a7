"""The resync plan made in bounded steps (#18): the same pages as sizing the whole set at once, whatever the chunk
size and whatever is committed between the steps."""

from __future__ import annotations

import hashlib
import random

import pytest

from provisionerd.domain.model import (
    Epoch,
    Fact,
    InstanceFact,
    Lost,
    OrphanReported,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from refcontroller.cluster import Cluster, ResyncPlanner
from refcontroller.paging import PAGE_BYTES, encoded_bound, page_bounds
from refcontroller.store import FactStore

E = Epoch(1, 1)
PROVIDERS = ("aws", "gcp")


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def mixed_history(rng: random.Random, ops: int) -> tuple[list[Fact], list[tuple[str, str]]]:
    """Facts of two providers: ended lifecycles, live machines, failed intents, big intents (past the byte bound of a
    page in a few), losses and orphan reports; and the live ``(provider, machine)`` pairs left at the end."""
    facts: list[Fact] = []
    live: list[tuple[str, str]] = []
    for n in range(ops):
        p = rng.choice(PROVIDERS)
        op = f"op{n}"
        count = rng.choice((1, 1, 2, 3, 40)) if rng.random() < 0.97 else 900  # 900 refs: a fact of ~130 KB
        refs = tuple(f"{op}-r{k}" for k in range(count))
        facts.append(RequestIntent(p, E, op, "t", count, refs, tuple(_h(r) for r in refs), "d"))
        if rng.random() < 0.1:
            facts.append(RequestFailed(p, E, op, "capacity"))
            continue
        machines = [f"{ref}-m" for ref in refs]
        for ref, machine in zip(refs, machines, strict=True):
            facts.append(InstanceFact(p, E, op, ref, machine, "t", _h(ref), f"h-{machine}", "10.0.0.1", 1.0))
        fate = rng.random()
        if fate < 0.5:
            facts.append(ReturnIntent(p, E, f"ret-{op}", tuple(machines), "idle"))
            facts.append(Returned(p, E, f"ret-{op}", tuple(machines)))
        elif fate < 0.6:
            facts.extend(Lost(p, E, f"lost-{m}", m, "gone") for m in machines)
        else:
            live.extend((p, m) for m in machines)
        if rng.random() < 0.05:
            facts.append(OrphanReported(p, E, f"orphan-{n}", f"stray-{n}", "ghost", "{}"))
    return facts, live


def reference_ranges(store: FactStore, providers: tuple[str, ...], as_of: int) -> list[tuple[int, int]]:
    """The plan as it was made before #18's stepping: every size fetched at once, then paged."""
    sizes = store.fact_sizes(providers, as_of)
    pages = page_bounds([encoded_bound(size) for _, size in sizes])
    return [(sizes[page.start][0], sizes[page.stop - 1][0]) for page in pages if len(page)]


@pytest.mark.sweep
def test_stepped_plan_pages_as_the_whole_set_did_for_any_chunk_and_commits_between_steps() -> None:
    rng = random.Random(18)
    store = FactStore.open(":memory:")
    facts, live = mixed_history(rng, 400)
    store.append_many(facts, "d1")
    as_of = store.last_index()
    expected = {providers: reference_ranges(store, providers, as_of) for providers in (("aws",), PROVIDERS)}
    assert len(expected[PROVIDERS]) >= 4  # several pages, and the 130 KB intents end pages on bytes
    assert any(b - a + 1 < 500 for a, b in expected[PROVIDERS][:-1])
    steps = 0
    for chunk in (5, 97, 500, 10_000):
        for providers, ranges in expected.items():
            planner = ResyncPlanner(store, providers, (), as_of, False, 0, chunk=chunk)
            while (plan := planner.step()) is None:
                steps += 1
                if live and rng.random() < 0.2:  # a live machine is returned meanwhile: it stays in this plan
                    p, machine = live.pop()
                    store.append(ReturnIntent(p, E, f"late-{machine}", (machine,), "idle"), "d1")
                    store.append(Returned(p, E, f"late-{machine}", (machine,)), "d1")
            assert list(plan.fact_ranges) == ranges, (chunk, providers)
            assert plan.as_of == as_of and not plan.incremental
    assert steps > 500 and store.last_index() > as_of  # the stepping really interleaved with commits
    # the set as of the new index has lost the returned machines, and the stepped plan follows it
    cluster = Cluster.open(store, 1, 10.0, 2.0, 0.0)
    now = store.last_index()
    assert list(cluster.resync_plan(PROVIDERS).fact_ranges) == reference_ranges(store, PROVIDERS, now)
    assert reference_ranges(store, PROVIDERS, now) != expected[PROVIDERS]


def test_stepped_incremental_plan_pages_every_later_fact() -> None:
    store = FactStore.open(":memory:")
    facts, _ = mixed_history(random.Random(7), 200)
    store.append_many(facts, "d1")
    after, as_of = 40, store.last_index()
    sizes = store.facts_after(PROVIDERS, after, as_of)
    pages = page_bounds([encoded_bound(size) for _, size in sizes])
    expected = [(sizes[page.start][0], sizes[page.stop - 1][0]) for page in pages if len(page)]
    for chunk in (1, 3, 500):
        planner = ResyncPlanner(store, PROVIDERS, (), as_of, True, after, chunk=chunk)
        while (plan := planner.step()) is None:
            pass
        assert list(plan.fact_ranges) == expected and plan.incremental


def test_no_page_passes_the_bounds_and_an_empty_set_has_no_pages() -> None:
    store = FactStore.open(":memory:")
    facts, _ = mixed_history(random.Random(3), 300)
    store.append_many(facts, "d1")
    planner = ResyncPlanner(store, PROVIDERS, (), store.last_index(), False, 0, chunk=50)
    while (plan := planner.step()) is None:
        pass
    sizes = dict(store.fact_sizes(PROVIDERS, store.last_index()))
    for first, last in plan.fact_ranges:
        page = [n for i, n in sizes.items() if first <= i <= last]
        assert len(page) <= 500 and (len(page) == 1 or sum(encoded_bound(n) for n in page) <= PAGE_BYTES)
    assert ResyncPlanner(store, ("none",), (), store.last_index(), False, 0).step() is not None
    empty = ResyncPlanner(store, ("none",), (), store.last_index(), False, 0).step()
    assert empty is not None and empty.fact_ranges == ()
