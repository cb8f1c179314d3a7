"""Decoding work is bounded by what a frame may hold, not by its size: list caps checked on a list's length before
any element is read, a unit budget per frame kind, and ``peek`` reading only the frame's kind."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest
import wire_strategies

from provisionerd.domain.errors import DecodeError, FrameOverBounds
from provisionerd.domain.model import DemandItem, ResourceShape
from provisionerd.testing.hostile_frames import LIST_FIELDS, list_bomb
from provisionerd.wire import bounds, codec
from provisionerd.wire.messages import AdminSetDemand, DemandPage, Heartbeat, Join
from provisionerd.wire.paging import DEMAND_PAGE_ITEMS, demand_pages


@pytest.mark.parametrize(("member", "path"), LIST_FIELDS, ids=lambda v: v if isinstance(v, str) else ".".join(v))
def test_every_list_bearing_message_filled_with_empty_elements_is_refused_on_its_length(
    member: str, path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = list_bomb(member, path)
    assert len(body) == 1 << 20
    assert codec.peek(body).member == member
    spent: list[str] = []  # every struct on the way in charges one unit, every list its length, before it is read
    real = codec._spend

    def counting(units: int, what: str) -> None:
        spent.append(what)
        real(units, what)

    monkeypatch.setattr(codec, "_spend", counting)
    with pytest.raises(FrameOverBounds, match="elements, at most"):
        codec.decode(body)
    # Refused before the list's first element: only the structs on the path to it were charged (and so built), never
    # the list itself, which is charged before its elements are read.
    assert len(spent) <= len(path) + 1, spent


def test_the_issue_frame_holds_250000_zero_size_structs_and_costs_nothing_to_refuse() -> None:
    body = list_bomb("adminSetDemand", ("items",))
    with pytest.raises(FrameOverBounds, match="250000 elements, at most 20000"):
        codec.decode(body)


def test_a_list_at_its_cap_decodes_and_one_more_is_refused() -> None:
    assert len(codec.decode(list_bomb("demandPage", ("items",), bounds.PAGE_ITEMS)).msg.items) == bounds.PAGE_ITEMS
    with pytest.raises(FrameOverBounds, match="DemandPage.items holds 501"):
        codec.decode(list_bomb("demandPage", ("items",), bounds.PAGE_ITEMS + 1))
    join = Join(role="worker", identity="w", providers=[f"p{i}" for i in range(bounds.MAX_PROVIDERS + 1)])
    with pytest.raises(FrameOverBounds, match="Join.providers"):
        codec.decode(codec.encode(join))


def test_the_unit_budget_counts_structs_and_map_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = ResourceShape(ncpus=1, mem_mb=1, attributes={"zone": "a", "rack": "r1"})
    page = DemandPage(1, 0, 1, [DemandItem(f"d{i}", shape, 1) for i in range(10)])
    envelope, units = codec.decode_metered(codec.encode(page))
    assert envelope.msg == page
    assert units == 1 + 10 * (1 + 1 + 2)  # the page; per item: the item, its shape, two attributes
    monkeypatch.setattr(bounds, "DEFAULT_MAX_UNITS", units - 1)
    with pytest.raises(FrameOverBounds, match="decoding budget"):
        codec.decode(codec.encode(page))


def test_paging_defaults_stay_within_the_caps() -> None:
    assert DEMAND_PAGE_ITEMS <= bounds.PAGE_ITEMS
    items = [DemandItem(f"d{i}", ResourceShape(ncpus=1, mem_mb=1), 1) for i in range(3 * DEMAND_PAGE_ITEMS)]
    for page in demand_pages(7, items):
        assert codec.decode(codec.encode(page)).msg == page
    big = AdminSetDemand(items[:1000])
    assert codec.decode(codec.encode(big)).msg == big


def test_peek_reads_the_kind_and_corr_only() -> None:
    head = codec.peek(codec.encode(Heartbeat(4), corr=9))
    assert (head.corr, head.member, head.kind) == (9, "heartbeat", Heartbeat)
    with pytest.raises(DecodeError):
        codec.peek(b"\x00" * 7)
    with pytest.raises(DecodeError):
        codec.peek(b"\xff" * 64)


@hypothesis.given(wire_strategies.messages, st.integers(0, 2**64 - 1), st.binary(max_size=80))
@hypothesis.settings(max_examples=300, deadline=None)
def test_peek_prefix_agrees_with_peek_or_declines(msg, corr: int, junk: bytes) -> None:
    body = codec.encode(msg, corr)
    head = codec.peek_prefix(body[: codec.PREFIX_BYTES])
    assert head == codec.peek(body)  # what writers produce is always settled by its prefix
    # Arbitrary bytes: declined, or the same answer as the full reader's when it has one.
    mangled = (junk + body[len(junk) :])[: len(body)]
    guess = codec.peek_prefix(mangled[: codec.PREFIX_BYTES])
    if guess is not None:
        try:
            assert guess == codec.peek(mangled)
        except DecodeError:
            pass  # the full body is malformed: a refusal on the kind or as bad_frame both close
