"""The SQLite store (JSON round trips, term fencing, indexes) and the pager."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rc_factories import instance, intent

from provisionerd.domain.model import (
    Epoch,
    Lost,
    OrphanAdopted,
    OrphanReported,
    RequestFailed,
    Returned,
    ReturnIntent,
)
from refcontroller.jsonconv import JsonDocumentError, fact_from_json, fact_to_json
from refcontroller.paging import page_bounds
from refcontroller.store import FactStore, LatestFact

E = Epoch(3, 7)
EVERY_KIND = [
    intent("p", E),
    instance("p", E, "i-1"),
    RequestFailed("p", E, "op-1", "capacity"),
    ReturnIntent("p", E, "op-2", ("m-1", "m-2"), "idle"),
    Returned("p", E, "op-2", ("m-1",)),
    Lost("p", E, "op-3", "m-2", "reclaimed"),
    OrphanReported("p", E, "op-4", "m-9", "ghost", '{"seen": 3}'),
    OrphanAdopted("p", E, "op-5", "m-9", "i-9", "h", "10.0.0.9"),
]


@pytest.mark.parametrize("fact", EVERY_KIND, ids=lambda f: type(f).__name__)
def test_every_fact_kind_round_trips_through_the_log(tmp_path: Path, fact) -> None:
    store = FactStore.open(tmp_path / "f.sqlite")
    committed = store.append(fact, "d1")
    store.close()
    store = FactStore.open(tmp_path / "f.sqlite")
    assert list(store.all_facts()) == [committed]
    assert store.latest("p") == LatestFact(E, "d1")
    store.close()


def test_stored_json_is_tagged_and_strict() -> None:
    text = fact_to_json(Lost("p", E, "op", "m", "gone"))
    assert '"kind":"Lost"' in text
    with pytest.raises(JsonDocumentError, match="extra fields"):
        fact_from_json(text.replace('"kind"', '"surprise":1,"kind"'))
    with pytest.raises(JsonDocumentError):
        fact_from_json("{not json")


def test_indexes_strictly_increase_and_duplicates_are_refused(store: FactStore) -> None:
    indexes = [store.append(Lost("p", E, f"op-{i}", "m", "x"), "d1").index for i in range(20)]
    assert indexes == sorted(set(indexes)) and indexes[0] >= 1
    with pytest.raises(ValueError):
        store.append(Lost("p", E, "op-0", "m", "x"), "d1")
    assert store.count() == 20 and store.last_index() == indexes[-1]
    assert store.latest_epochs() == {"p": E}


def test_term_never_goes_back(store: FactStore) -> None:
    assert store.load_term() == 0
    store.save_term(2)
    with pytest.raises(ValueError):
        store.save_term(2)
    assert store.load_term() == 2


def test_token_claims_come_from_intents_and_instance_facts(store: FactStore) -> None:
    store.append(intent("p", E, refs=("i-1",)), "d1")
    from rc_factories import sha

    [claim] = store.token_claims(sha("tok-i-1"))
    assert (claim.instance_ref, claim.machine_id) == ("i-1", "")
    store.append(instance("p", E, "i-1"), "d1")
    [claim] = store.token_claims(sha("tok-i-1"))
    assert claim.machine_id == "m-i-1"
    assert store.use_token(sha("tok-i-1"), "i-1", 1.0)
    assert not store.use_token(sha("tok-i-1"), "i-1", 2.0)


@given(st.lists(st.integers(0, 2000), max_size=60), st.integers(1, 3000), st.integers(1, 10))
def test_pages_cover_everything_in_order_within_limits(sizes: list[int], max_bytes: int, max_items: int) -> None:
    pages = page_bounds(sizes, max_bytes=max_bytes, max_items=max_items)
    assert [i for page in pages for i in page] == list(range(len(sizes)))
    for page in pages:
        assert len(page) <= max_items
        assert len(page) == 1 or sum(sizes[i] for i in page) <= max_bytes
    assert len(pages) >= 1
