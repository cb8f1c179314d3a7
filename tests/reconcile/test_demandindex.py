"""The per-snapshot index a plan pass reuses: built once per snapshot object, the same answers as building it."""

from __future__ import annotations

from provisionerd.domain.model import DemandItem, DemandSnapshot, ResourceShape
from provisionerd.planner import demand_index as demandindex
from provisionerd.planner.demand_index import build, demand_index
from provisionerd.planner.offers import requirement_of


def snapshot(seq: int, *ids: str) -> DemandSnapshot:
    return DemandSnapshot(seq, tuple(DemandItem(d, ResourceShape(ncpus=1 + i), i - 1) for i, d in enumerate(ids)))


def test_items_sorted_wanted_clamped_and_bad_ids_noted():
    index = build(snapshot(3, "b", "a", "", "b", "c"))
    assert list(index.items) == ["a", "b", "c"]
    assert index.wanted == {"b": 0, "a": 0, "c": 3}  # counts -1, 0, 3: never below zero
    assert [(n.kind, n.demand_id) for n in index.notes] == [("invalid_demand", ""), ("invalid_demand", "b")]


def test_the_same_snapshot_object_is_indexed_once_an_equal_copy_again():
    first = snapshot(1, "a", "b")
    index = demand_index(first)
    assert demand_index(first) is index
    copy = snapshot(1, "a", "b")
    assert copy == first and demand_index(copy) is not index  # identity, not equality: no hash of every item
    item = first.items[1]
    assert index.requirement(item) == requirement_of(item)
    assert index.requirement(item) is index.requirement(item)


def test_the_cache_is_bounded():
    snapshots = [snapshot(seq, "a") for seq in range(demandindex.CACHE_SIZE * 3)]
    for s in snapshots:
        demand_index(s)
    assert len(demandindex._recent) == demandindex.CACHE_SIZE
    assert {i.snapshot.seq for i in demandindex._recent} == {s.seq for s in snapshots[-demandindex.CACHE_SIZE :]}
