"""Paged ``listMachines`` and ``getReturnRequests`` (``provisionerd.provider.paging``, the typed client's reads):
the pages join up, a hostile plugin's pages are refused with a typed error, an older plugin that does not page
still works, and the orphan pass reads a refused listing as ``listing_unreadable`` with the reason."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from provisionerd.execution.orphan_reads import read_listing
from provisionerd.orphans.model import Unreadable
from provisionerd.provider import paging
from provisionerd.provider.client import PluginClient
from provisionerd.provider.paging import PageJoin, PagingViolation, join_pages, keyset_page, max_pages
from provisionerd.provider.runtime import check_input, check_output
from provisionerd.provider.values import MachineRef
from provisionerd.telemetry.redaction import Redactor

CLUSTER = "c1"


def machine(i: int) -> dict[str, Any]:
    return {
        "machineId": f"i-{i:06d}",
        "name": f"n{i}",
        "status": "running",
        "launchtime": 1700000000,
        "tags": {"provisionerd:cluster": CLUSTER},
    }


# --- the pure joining function -------------------------------------------------------------------------------------


def keyset_pages(entries, page_size):
    """Every page a keyset plugin gives, following its cursors."""
    cursor = None
    while True:
        page, cursor = keyset_page(entries, cursor, page_size)
        yield page, cursor
        if cursor is None:
            return


@settings(max_examples=300, deadline=None)
@given(ids=st.sets(st.integers(0, 10_000), max_size=300), page_size=st.integers(1, 400))
def test_keyset_pages_join_up_with_no_duplicate_and_none_missing(ids, page_size):
    entries = [machine(i) for i in ids]
    pages = list(keyset_pages(entries, page_size))
    assert all(len(page) <= page_size for page, _ in pages)
    assert sum(len(page) for page, _ in pages) == len(entries)  # no duplicate across pages
    joined = join_pages(pages, lambda m: m["machineId"], page_size=page_size, limit=max_pages(len(ids), page_size))
    assert sorted(m["machineId"] for m in joined) == sorted(m["machineId"] for m in entries)  # none missing
    assert len(pages) == max(1, -(-len(ids) // page_size))  # ceil: no empty page beyond the last


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 50), max_size=120), cuts=st.lists(st.integers(0, 120), max_size=8))
def test_an_entry_on_two_pages_is_kept_once_in_its_later_place(ids, cuts):
    # Any split of any sequence (duplicates included, as an offset cursor gives while the fleet changes).
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    pages = [([machine(i) for i in ids[a:b]], f"c{n}") for n, (a, b) in enumerate(itertools.pairwise(bounds))]
    pages = pages or [([], None)]
    pages[-1] = (pages[-1][0], None)
    join = PageJoin("p", "listMachines", 200, 100, lambda m: m["machineId"])
    for entries, cursor in pages:
        join.add(entries, cursor)
    expected = list(dict.fromkeys(reversed(ids)))[::-1]  # each id once, at its last occurrence
    assert [m["machineId"] for m in join.items] == [f"i-{i:06d}" for i in expected]
    assert join.duplicates == len(ids) - len(expected)
    assert join_pages(pages, lambda m: m["machineId"], page_size=200, limit=100) == join.items


def test_a_cursor_returned_again_is_a_loop_and_refused():
    join = PageJoin("p", "listMachines", 2, 100, lambda m: m["machineId"])
    assert join.add([machine(1), machine(2)], "i-000002") == "i-000002"
    with pytest.raises(PagingViolation, match="cursor loop: page 2 returned cursor 'i-000002' again"):
        join.add([machine(1), machine(2)], "i-000002")


def test_an_endless_sequence_of_pages_stops_at_the_cap_from_the_expected_fleet():
    limit = max_pages(20_000, 1000)
    assert limit == 4 * 20 + 1  # FLEET_SLACK times the expected pages, plus one
    assert max_pages(10, 1000) == 41  # never below MIN_EXPECTED's pages
    endless = (([machine(n)], f"c{n}") for n in range(10**9))
    with pytest.raises(PagingViolation, match=f"more than {limit} pages of 1000"):
        join_pages(endless, lambda m: m["machineId"], page_size=1000, limit=limit)


def test_a_page_larger_than_asked_is_refused_unless_it_is_the_only_answer():
    join = PageJoin("p", "listMachines", 2, 100, lambda m: m["machineId"])
    with pytest.raises(PagingViolation, match="page 1 has 3 entries, 2 asked"):
        join.add([machine(1), machine(2), machine(3)], "more")
    # An older plugin ignores pageSize: everything, and no nextCursor. One page, taken whole.
    old = PageJoin("p", "listMachines", 2, 100, lambda m: m["machineId"])
    assert old.add([machine(i) for i in range(5)], None) is None and len(old.items) == 5


def test_the_paging_fields_are_in_the_schemas():
    redact = Redactor()
    check_input("p", "listMachines", {"tags": {"provisionerd:cluster": "c"}, "cursor": "x", "pageSize": 5}, redact)
    check_input("p", "getReturnRequests", {"machines": [], "cursor": "x", "pageSize": 5}, redact)
    check_output("p", "listMachines", {"machines": [machine(1)], "nextCursor": "i-1"}, redact)
    check_output("p", "listMachines", {"machines": [], "nextCursor": None}, redact)
    check_output("p", "getReturnRequests", {"requests": [], "nextCursor": "x"}, redact)
    with pytest.raises(Exception, match="pageSize"):
        check_input("p", "listMachines", {"tags": {"provisionerd:cluster": "c"}, "pageSize": 0}, redact)
    with pytest.raises(Exception, match="nextCursor"):
        check_output("p", "listMachines", {"machines": [], "nextCursor": ""}, redact)


# --- through the typed client, against transports that page (or not) -------------------------------------------


class PagingTransport:
    """An in-memory plugin: ``mode`` "keyset" pages like the shipped plugins; "old" ignores the paging fields;
    "loop", "endless" and "oversized" are hostile. Every input and output is checked against the schemas."""

    name = "p"

    def __init__(self, count: int, mode: str = "keyset", reclaimed: int = 0) -> None:
        self.entries = [machine(i) for i in range(count)]
        self.reclaimed = {m["machineId"] for m in self.entries[:reclaimed]}
        self.mode = mode
        self.inputs: list[dict[str, Any]] = []

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        check_input(self.name, action, input, Redactor())
        self.inputs.append(dict(input))
        await trio.lowlevel.checkpoint()
        if action == "getReturnRequests":
            asked = {m["machineId"] for m in input["machines"]}
            wanted = [
                {"machine": m["name"], "machineId": m["machineId"]}
                for m in self.entries
                if m["machineId"] in asked and m["machineId"] in self.reclaimed
            ]
            page, cursor = keyset_page(wanted, input.get("cursor"), input.get("pageSize"))
            return check_output(self.name, action, {"requests": page, "nextCursor": cursor}, Redactor())
        size, cursor = input.get("pageSize"), input.get("cursor")
        if self.mode == "old":
            out: dict[str, Any] = {"machines": self.entries}
        elif self.mode == "loop":
            out = {"machines": self.entries[:size], "nextCursor": "same"}
        elif self.mode == "endless":
            n = int(cursor or 0)
            out = {"machines": [machine(n)], "nextCursor": str(n + 1)}
        elif self.mode == "oversized":
            out = {"machines": self.entries[: size + 1], "nextCursor": "more"}
        else:
            page, next_cursor = keyset_page(self.entries, cursor, size)
            out = {"machines": page, "nextCursor": next_cursor}
        return check_output(self.name, action, out, Redactor())

    async def aclose(self) -> None:
        pass


def listed(client: PluginClient, expected: int = 0):
    async def main():
        return await client.list_machines({"provisionerd:cluster": CLUSTER}, expected=expected)

    return trio.run(main)


def test_the_client_reads_every_page_once_and_joins_them():
    transport = PagingTransport(2345)
    machines = listed(PluginClient(transport, page_size=500))
    assert [m.machine_id for m in machines] == [f"i-{i:06d}" for i in range(2345)]
    assert [i.get("cursor") for i in transport.inputs] == [None, "i-000499", "i-000999", "i-001499", "i-001999"]
    assert {i["pageSize"] for i in transport.inputs} == {500}


def test_an_old_plugin_that_ignores_paging_still_works():
    transport = PagingTransport(1200, mode="old")
    machines = listed(PluginClient(transport, page_size=500))
    assert len(machines) == 1200 and len(transport.inputs) == 1


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("loop", "cursor loop: page 2 returned cursor 'same' again"),
        ("endless", "more than 81 pages of 500"),
        ("oversized", "page 1 has 501 entries, 500 asked"),
    ],
)
def test_a_hostile_plugin_makes_the_listing_unreadable_with_the_reason(mode, reason):
    transport = PagingTransport(1200, mode=mode)
    client = PluginClient(transport, page_size=500)

    async def main():
        return await read_listing(client, CLUSTER, expected=100)

    listing = trio.run(main)
    assert isinstance(listing, Unreadable) and reason in listing.reason
    assert "provider 'p' listMachines" in listing.reason
    assert len(transport.inputs) <= max_pages(100, 500)  # bounded work, whatever the plugin does


@pytest.mark.sweep
def test_the_page_cap_follows_the_expected_fleet():
    transport = PagingTransport(30_000)
    machines = listed(PluginClient(transport, page_size=100), expected=30_000)  # 300 pages, cap 1201
    assert len(machines) == 30_000 and len(transport.inputs) == 300
    with pytest.raises(PagingViolation, match="more than 401 pages of 100"):
        listed(PluginClient(PagingTransport(50_000), page_size=100), expected=0)


def test_the_reclaim_query_is_chunked_and_its_answers_paged():
    transport = PagingTransport(5000, reclaimed=7)
    client = PluginClient(transport, reclaim_chunk=2000)
    refs = [MachineRef(m["machineId"], m["name"]) for m in transport.entries]

    async def main():
        return await client.get_return_requests(refs)

    reclaims = trio.run(main)
    assert sorted(r.machine_id for r in reclaims) == [f"i-{i:06d}" for i in range(7)]
    assert [len(i["machines"]) for i in transport.inputs] == [2000, 2000, 1000]  # the request side in chunks
    assert all(i["pageSize"] == 2000 for i in transport.inputs)
    # And an answer longer than a page follows its cursor within the chunk.
    small = PluginClient(PagingTransport(10, reclaimed=5), reclaim_chunk=2)
    tiny = [MachineRef(f"i-{i:06d}", f"n{i}") for i in range(10)]
    assert len(trio.run(small.get_return_requests, tiny)) == 5


def test_the_default_page_stays_well_under_the_line_cap():
    import json

    page = {"machines": [machine(i) for i in range(paging.LIST_PAGE_SIZE)], "nextCursor": "i-000999"}
    assert len(json.dumps(page)) * 8 < 8 << 20


def test_the_reclaim_poll_names_the_live_machines_in_chunks():
    from types import SimpleNamespace

    from provisionerd.execution.reclaims import ReclaimPoll
    from provisionerd.planner.state import Reclaimed
    from provisionerd.provider.values import Features

    transport = PagingTransport(4500, reclaimed=3)
    live = SimpleNamespace(live=True)
    machines = {
        m["machineId"]: SimpleNamespace(provider="p", state=live, machine_id=m["machineId"], hostname=m["name"])
        for m in transport.entries
    }
    view = SimpleNamespace(facts=SimpleNamespace(machines=machines))
    applied, emitted = [], []
    events = SimpleNamespace(emit=lambda kind, **fields: emitted.append((kind, fields)))

    async def read(provider: str) -> Features:
        return Features()  # no reclaimsByTags: every live machine is named

    executor = SimpleNamespace(client=lambda name: PluginClient(transport), features=SimpleNamespace(read=read))
    poll = ReclaimPoll(None, executor, events, 30.0, leased=list, apply=applied.append, wall=lambda: 5.0)
    trio.run(poll.poll, "p", view)
    assert [len(i["machines"]) for i in transport.inputs] == [2000, 2000, 500]  # never one line of 4,500
    reclaimed = ["i-000000", "i-000001", "i-000002"]
    assert applied == [Reclaimed("p", tuple(reclaimed), 5.0)]
    assert emitted == [("reclaimed", {"provider": "p", "machines": reclaimed})]
