"""A ``listMachines`` page decoded straight into its rows (issue 36: ~0.07 s of CPU less an orphan pass at 100k
machines). The decode is a shortcut, never another reading: a page it takes is one the schema takes, read into the
very rows (and cursor) that parsing, checking and ``read_machines`` give; anything else goes the old way, which says
what is wrong. The persistent transport takes the shortcut only for ``list_page`` calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from persistent_kit import run_with
from test_fast_paths import LISTED_ENTRIES
from test_schemas import mutated

from provisionerd.domain.errors import ProviderAnswerInvalid, ProviderProtocolViolation
from provisionerd.provider import contract
from provisionerd.provider.client import PluginClient
from provisionerd.provider.lines import parse_answer
from provisionerd.provider.paging import next_cursor
from provisionerd.provider.runtime import parse_json
from provisionerd.provider.schemas import contract as schemas
from provisionerd.provider.values import ListingPage

CURSORS = st.one_of(st.none(), st.text(max_size=3), st.integers(0, 3), st.text(min_size=4090, max_size=4100))
PAGES = st.fixed_dictionaries({"machines": st.lists(LISTED_ENTRIES, max_size=4)}, optional={"nextCursor": CURSORS})
VALID_PAGES = st.fixed_dictionaries(
    {
        "machines": st.lists(
            st.fixed_dictionaries(
                {
                    "machineId": st.text(min_size=1, max_size=6),
                    "name": st.text(max_size=6),
                    "status": st.sampled_from(["running", "pending", ""]),
                    "launchtime": st.integers(0, 2**40),
                    "tags": st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=4), max_size=3),
                },
                optional={
                    "privateIpAddress": st.one_of(st.none(), st.text(max_size=64)),
                    "instanceRef": st.one_of(st.none(), st.text(max_size=6)),
                    "extra": st.integers(),
                },
            ),
            max_size=4,
        )
    },
    optional={"nextCursor": st.one_of(st.none(), st.text(min_size=1, max_size=8))},
)


def the_old_way(raw: bytes) -> tuple[str, object]:
    """What parsing, checking and reading give: ("refused", None), or ("page", (rows, cursor))."""
    document = parse_json(raw)
    if schemas().output_violations("listMachines", document, parsed=True):
        return "refused", None
    try:
        rows = contract.read_machines("p", document)
    except ProviderAnswerInvalid:
        return "refused", None
    return "page", (list(rows), next_cursor("p", "listMachines", document))


def check(document: object) -> ListingPage | None:
    raw = json.dumps(document).encode()
    page = contract.decode_listing_page(raw)
    if page is not None:
        assert schemas().validator("listMachines.output.json").is_valid(parse_json(raw)), raw[:300]
        verdict, read = the_old_way(raw)
        assert verdict == "page"
        rows, cursor = read  # type: ignore[misc]
        assert page.machines == rows and page.nextCursor == cursor
        for new, old in zip(page.machines, rows, strict=True):  # the same types too, not only equal values
            assert [type(getattr(new, f)) for f in new.__struct_fields__] == [
                type(getattr(old, f)) for f in old.__struct_fields__
            ]
    return page


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(PAGES, mutated(kinds=("out",)).map(lambda case: case[1])))
def test_a_page_decoded_straight_is_one_the_schema_takes_read_into_the_same_rows(document):
    check(document)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALID_PAGES)
def test_a_regular_page_is_decoded_straight(document):
    """Regular: what the schema takes with each instanceRef a string or null (the shortcut is really taken)."""
    assert check(document) is not None


def test_pages_it_leaves_to_the_old_way() -> None:
    machine = {"machineId": "i-1", "name": "n", "status": "running", "launchtime": 5, "tags": {}}
    assert check({"machines": [machine]}) is not None
    for odd in (
        {"instanceRef": 5},  # the schema takes it; a row does not read it
        {"launchtime": 10**400},  # the schema takes it; no double holds it (the old way refuses it)
        {"launchtime": 1.5},  # not an integer
        {"launchtime": -1},
        {"name": None},
        {"tags": {"": "x"}},
        {"privateIpAddress": "x" * 65},
    ):
        assert contract.decode_listing_page(json.dumps({"machines": [{**machine, **odd}]}).encode()) is None, odd
    assert contract.decode_listing_page(b'{"machines": [], "nextCursor": ""}') is None


PAGE = b'{"machines": [{"machineId": "i-1", "name": "n", "status": "running", "launchtime": 5, "tags": {}}]}'
LAST = b'{"machines": [], "nextCursor": "c"}'


@pytest.mark.parametrize(
    "line",
    [
        b'{"id": 1, "result": %s}' % PAGE,
        b'{"result": %s, "id": 7}' % PAGE,
        b'{"id": 1, "result": %s, "id": 2}' % PAGE,  # a member given twice: its last value
        b'{"id": 1, "result": %s, "result": %s}' % (PAGE, LAST),
        b'{"id": 1, "result": %s, "error": {"code": "x"}}' % PAGE,  # both: not an answer
        b'{"id": 1, "result": %s, "jsonrpc": "2.0"}' % PAGE,  # another member: read the old way
        b'{"id": 1.0, "result": %s}' % PAGE,
        b'{"id": true, "result": %s}' % PAGE,
        b'{"id": 99999999999999999999999, "result": %s}' % PAGE,
        b'{"id": 1, "result": {"a": 1}}',
        b'{"id": 1, "error": {"code": "x"}}',
        b'{"id": 1, "result": 1, "error": 2}',
        b'{"id": 1}',
        b"[1]",
        b"not json",
        b'{"id": 1, "result": null}',
    ],
)
def test_a_page_answer_is_the_answer_parse_answer_reads(line: bytes) -> None:
    """A line read in one pass is the answer ``parse_answer`` reads, its result the page ``decode_listing_page``
    reads; any other line is left to ``parse_answer`` (which refuses the ones that are no answer at all)."""
    got = contract.decode_page_answer(line)
    try:
        answer = parse_answer(line)
    except ValueError:
        assert got is None
        return
    if got is not None:
        assert got.id == answer.id and not answer.is_error
        assert got.result == contract.decode_listing_page(json.dumps(answer.result).encode())


def test_a_regular_page_answer_is_read_in_one_pass() -> None:
    got = contract.decode_page_answer(b'{"id": 3, "result": %s}' % PAGE)
    assert got is not None and got.id == 3 and [row.machine_id for row in got.result.machines] == ["i-1"]
    assert contract.decode_page_answer(b'{"id": 3, "result": %s, "error": {}}' % PAGE) is None


@pytest.mark.process
def test_the_persistent_transport_hands_over_regular_pages_as_rows(config) -> None:
    async def body(transport):
        client = PluginClient(transport)
        page = await transport.list_page({"tags": {"provisionerd:cluster": "regular"}})
        assert isinstance(page, ListingPage) and page.nextCursor == "m-2"
        assert [row.machine_id for row in page.machines] == ["m-1", "m-2"]
        regular = await client.list_machines({"provisionerd:cluster": "regular"})
        odd = await client.list_machines({"provisionerd:cluster": "odd-ref"})  # read the old way, entry by entry
        with pytest.raises(ProviderAnswerInvalid):
            await client.list_machines({"provisionerd:cluster": "no-name"})
        with pytest.raises(ProviderProtocolViolation):
            await client.list_machines({"provisionerd:cluster": "garbage"})
        return regular, odd, await transport.call("listMachines", {"tags": {"provisionerd:cluster": "regular"}})

    regular, odd, document = run_with(config, body)
    assert [row.machine_id for row in regular] == ["m-1", "m-2", "m-3", "m-4"]
    assert [row.address for row in regular] == ["10.0.0.1", "", "10.0.0.3", ""]
    assert [row.instance_ref for row in odd] == ["c/1", "c/2", "c/3", "c/4"]  # the instance tag first
    assert isinstance(document, dict)  # ``call`` gives documents, as the kit reads them
    assert document["machines"][0]["machineId"] == "m-1"
