"""The controller's count of licence units in use (``DemandPage.licenses``) from the admin to the orphan cycle: the
reference controller validates, stores and pages it with the demand; the wire carries it on page 0; the daemon's
assembler keeps it with the snapshot; ``licenses_in_use`` reads it per provider, and a pool it does not name is
unknown (``None``), never 0."""

from __future__ import annotations

import pytest

from provisionerd.controller.view import DemandAssembler
from provisionerd.domain.model import DemandItem, DemandSnapshot, LicenseUse, ResourceShape
from provisionerd.execution.orphan_licences import counted
from provisionerd.execution.orphan_reads import licenses_in_use
from provisionerd.provider.values import LicenseGrant
from provisionerd.wire.codec import decode, encode
from provisionerd.wire.messages import AdminSetDemand
from provisionerd.wire.paging import demand_pages
from refcontroller import demand
from refcontroller.store import FactStore

USES = (LicenseUse("sim", "matlab", 0), LicenseUse("sim", "ansys", 2), LicenseUse("other", "matlab", 5))
ITEMS = tuple(DemandItem(f"d{i}", ResourceShape(ncpus=1), 1) for i in range(7))


def test_the_licence_use_travels_on_page_zero_and_is_kept_with_the_snapshot():
    pages = demand_pages(9, ITEMS, max_items=3, licenses=USES)
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert [p.licenses for p in pages] == [USES, (), ()]
    assembler = DemandAssembler()
    decoded = [decode(encode(p, 0)).msg for p in reversed(pages)]  # through the codec, last page first
    snapshots = [assembler.add(p.snapshot_seq, p.page, p.page_count, p.items, p.licenses) for p in decoded]
    assert snapshots[:2] == [None, None] and snapshots[2] == DemandSnapshot(9, ITEMS, USES)
    admin = decode(encode(AdminSetDemand(ITEMS[:1], USES), 3)).msg
    assert admin == AdminSetDemand(ITEMS[:1], USES)


def test_a_newer_snapshot_drops_the_licences_of_an_unfinished_older_one():
    assembler = DemandAssembler()
    first = demand_pages(1, ITEMS, max_items=3, licenses=USES)[0]
    assert assembler.add(1, 0, 3, first.items, first.licenses) is None
    assert assembler.add(2, 0, 1, ()) == DemandSnapshot(2, (), ())


def test_the_reference_controller_validates_stores_and_reloads_it(tmp_path):
    assert demand.license_problems([LicenseUse("sim", "", 1), LicenseUse("sim", "a", -1)]) == [
        "licenses[0]: provider and pool must be 1..256 characters",
        "licenses[1].in_use: must be >= 0, not -1",
    ]
    assert demand.license_problems([LicenseUse("sim", "a", 1)] * 2) == ["licenses[1]: 'sim'/'a' appears twice"]
    current = DemandSnapshot(4, ITEMS)
    assert demand.next_snapshot(current, ITEMS) is None
    changed = demand.next_snapshot(current, ITEMS, USES)  # a change of the licence use alone is a new snapshot
    assert changed == DemandSnapshot(5, ITEMS, USES)
    store = FactStore.open(tmp_path / "f.sqlite")
    store.save_demand(changed)
    store.close()
    again = FactStore.open(tmp_path / "f.sqlite")
    assert again.load_demand() == changed
    again.close()


@pytest.mark.parametrize(
    ("snapshot", "provider", "expected"),
    [
        (None, "sim", None),  # no snapshot yet: the controller has not said
        (DemandSnapshot(1, ITEMS), "sim", None),  # an older controller, or one that counts no licence
        (DemandSnapshot(1, ITEMS, USES), "sim", {"matlab": 0, "ansys": 2}),
        (DemandSnapshot(1, ITEMS, USES), "third", None),
    ],
)
def test_licenses_in_use_per_provider(snapshot, provider, expected):
    assert licenses_in_use(snapshot, provider) == expected


def test_a_pool_the_controller_does_not_name_is_unknown_never_zero():
    grants = (LicenseGrant("matlab", 2, 0, 1.0), LicenseGrant("abaqus", 2, 0, 1.0))
    by_pool = {r.resource: r for r in counted(grants, {"matlab": 0})}
    assert by_pool["matlab"].in_use == 0 and by_pool["matlab"].returnable
    assert by_pool["abaqus"].in_use is None and not by_pool["abaqus"].returnable
    assert all(r.in_use is None for r in counted(grants, None))
