"""The orphan side of a provider without a listing: absent (not unreadable), never called, and stated in the report
with the classes it cannot see and the requests whose outcome is unknown."""

from __future__ import annotations

import json

import trio

from provisionerd.daemon.clients import ReadOnlyClient
from provisionerd.execution.orphan_reads import read_listing, unknown_outcomes
from provisionerd.orphans.model import ListingAbsent
from provisionerd.orphans.report import render_json, render_table, report_document
from provisionerd.provider.client import PluginClient

UNKNOWN = {
    "op_id": "c1:lsfex:i1:3",
    "template": "lsfex-small",
    "instance_refs": ["c1:lsfex:i1:3/0"],
    "detail": "ProviderTimeout: no answer in 1s",
}


def test_a_legacy_listing_is_absent_and_never_asked_for(world):
    adapter = world.adapter()
    guarded = ReadOnlyClient(PluginClient(adapter))
    listing = trio.run(read_listing, guarded, "c1")
    assert isinstance(listing, ListingAbsent) and listing.invisible == ("tagged_unknown", "ghost")
    assert "no listMachines" in listing.reason
    assert guarded.calls == [] and world.inputs() == []  # nothing was called, not even the plugin's templates
    assert unknown_outcomes(guarded) == ()


def test_the_report_states_the_invisible_classes_and_the_unknown_outcomes():
    invisible = {"lsfex": ("tagged_unknown", "ghost"), "sim": ()}
    document = report_document([], 0, invisible, {"lsfex": [UNKNOWN]})
    assert document == {
        "findings": [],
        "mutations": 0,
        "invisible": {"lsfex": ["tagged_unknown", "ghost"]},
        "unknown_outcomes": {"lsfex": [UNKNOWN]},
    }
    assert json.loads(render_json([], 0, invisible, {}))["unknown_outcomes"] == {"lsfex": []}
    # Providers that see everything keep the issue-6 document exactly.
    assert report_document([], 0, {"sim": ()}) == {"findings": [], "mutations": 0}
    table = render_table([], 0, invisible={"lsfex": ("tagged_unknown", "ghost")}, unknown={"lsfex": [UNKNOWN]})
    assert table.splitlines() == [
        "no orphan findings (mutations: 0)",
        "provider lsfex: cannot list machines; invisible here: tagged_unknown, ghost (not reported as none)",
        "provider lsfex: request c1:lsfex:i1:3 has an unknown outcome (template lsfex-small, refs c1:lsfex:i1:3/0): "
        "any machines it made are invisible",
    ]
