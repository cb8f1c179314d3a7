"""The idle pool (planner.idle_pool): runs added per offer, merged when taken from, due machines read from the head of
each run; checked against one plain sorted list per offer, as the pool was before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import fuzz_settings

from provisionerd.planner.idle_pool import IdlePool

KEYS = [("p", "t1"), ("p", "t2"), ("q", "t1")]
IDLE_TIME = {"p": 100.0, "q": 300.0}
NOW = 1000.0


@st.composite
def pools(draw):
    """Runs of (since, machine_id, record) per offer, each in order, machine ids unique; then some takes."""
    runs = []
    serial = 0
    for _ in range(draw(st.integers(0, 8))):
        key = draw(st.sampled_from(KEYS))
        sinces = draw(st.lists(st.sampled_from([0.0, 500.0, 700.0, 850.0, 900.0, 950.0, 1000.0]), min_size=1))
        run = []
        for since in sinces:
            serial += 1
            run.append((since, f"m{serial:03d}", object()))
        run.sort(key=lambda e: (e[0], e[1]))
        stop = draw(st.none() | st.integers(0, len(run) + 1))  # only the head of a kept list, or all of it
        runs.append((key, run, stop))
    takes = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 3)), max_size=4))
    return runs, takes


@fuzz_settings(150)
@given(pools())
def test_the_pool_takes_and_finds_due_machines_as_one_sorted_list_per_offer_would(case):
    runs, takes = case
    pool, plain = IdlePool(), {}
    for key, run, stop in runs:
        pool.add(key, run, stop)
        plain.setdefault(key, []).extend(run[:stop])
    for entries in plain.values():
        entries.sort(key=lambda e: (e[0], e[1]))
    assert bool(pool) == any(plain.values())
    for key, n in takes:  # the most recently idle are taken first
        entries = pool.entries(key)
        assert entries == plain.get(key, [])
        for _ in range(min(n, len(entries))):
            assert entries.pop() is plain[key].pop()
    assert {key: pool.count(key) for key in KEYS} == {key: len(plain.get(key, ())) for key in KEYS}
    wakes = []
    due = pool.due(NOW, IDLE_TIME.__getitem__, lambda at, now: wakes.append(at))
    for provider in IDLE_TIME:
        expected = [
            e
            for key, entries in plain.items()
            if key[0] == provider
            for e in entries
            if NOW - e[0] >= IDLE_TIME[key[0]]
        ]
        assert sorted(due.get(provider, []), key=lambda e: e[1]) == sorted(expected, key=lambda e: e[1])
    later = [
        e[0] + IDLE_TIME[key[0]] for key, entries in plain.items() for e in entries if NOW - e[0] < IDLE_TIME[key[0]]
    ]
    assert min(wakes, default=None) == min(later, default=None)  # the earliest is always told
