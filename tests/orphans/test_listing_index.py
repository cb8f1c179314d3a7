"""The listing's index in the classifier (``detect._index_listing``): the usual listing (every machine live, ours,
listed once) is read in one comprehension, any other machine by machine; the same index either way, for a listing
of ``ProviderMachine``s or of the rows a fleet listing is read into."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from provisionerd.domain.model import TAG_CLUSTER, TAG_PROVIDER, ProviderMachine
from provisionerd.orphans.detect import _index_each, _index_listing
from provisionerd.provider.values import ListingRow

CLUSTER, PROVIDER, PROTECT = "clu", "sim", "provisionerd:protect"
OURS = {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: PROVIDER}
STATUSES = ["running", "terminated"]
#: One change to a listing of the usual shape: the listings near the fast path's edge, where a wrong test would
#: take it.
CHANGED: dict[str, dict[str, str]] = {
    "terminated": {"status": "terminated"},
    "other cluster": {TAG_CLUSTER: "other"},
    "other provider": {TAG_PROVIDER: "other"},
    "protected": {PROTECT: "yes"},
    "protect ''": {PROTECT: ""},
}


def machine(machine_id: str, row: bool, status: str = "running", **tags: str) -> ProviderMachine | ListingRow:
    made = ProviderMachine(machine_id, "n", "succeed", status, 5.0, "10.0.0.1", "ref", {**OURS, **tags})
    return ListingRow.of(made) if row else made


@st.composite
def listings(draw: st.DrawFn) -> tuple[ProviderMachine | ListingRow, ...]:
    count = draw(st.integers(1, 5))
    listing = [machine(f"i-{n}", draw(st.booleans())) for n in range(count)]
    for change in draw(st.lists(st.sampled_from([*CHANGED, "repeat"]), max_size=2)):
        n, row = draw(st.integers(0, count - 1)), draw(st.booleans())
        mid = listing[n].machine_id
        if change == "repeat":
            listing.insert(draw(st.integers(0, len(listing))), machine(mid, row, draw(st.sampled_from(STATUSES))))
        else:
            changed = dict(CHANGED[change])
            listing[n] = machine(mid, row, changed.pop("status", "running"), **changed)
    return tuple(listing)


def index(found: tuple[set[str], dict[str, object]]) -> tuple[set[str], list[tuple[str, tuple[object, ...]]]]:
    listed, owned = found
    return listed, [
        (i, (m.machine_id, m.status, m.launch_time, m.instance_ref, dict(m.tags))) for i, m in owned.items()
    ]


@given(listings(), st.sampled_from([CLUSTER, CLUSTER, ""]))
def test_the_index_is_the_one_read_machine_by_machine(listing: tuple[object, ...], cluster: str) -> None:
    assert index(_index_listing(listing, cluster, PROVIDER, PROTECT)) == index(
        _index_each(listing, cluster, PROVIDER, PROTECT)
    )


def test_the_usual_listing_keeps_its_machines_and_a_repeated_id_still_keeps_the_first_copy() -> None:
    one = ListingRow(machine_id="i-1", launch_time=5.0, name="n", status="running", tags=dict(OURS))
    again = ListingRow(machine_id="i-1", launch_time=6.0, name="n", status="running", tags=dict(OURS))
    listed, owned = _index_listing((one,), CLUSTER, PROVIDER, PROTECT)
    assert listed == {"i-1"} and owned["i-1"] is one
    listed, owned = _index_listing((one, again), CLUSTER, PROVIDER, PROTECT)
    assert listed == {"i-1"} and owned["i-1"] is one
    protected = ListingRow(
        machine_id="i-1", launch_time=6.0, name="n", status="terminated", tags={**OURS, PROTECT: "yes"}
    )
    _, owned = _index_listing((one, protected), CLUSTER, PROVIDER, PROTECT)
    assert owned["i-1"].tags[PROTECT] == "yes" and owned["i-1"].machine_id == "i-1"
