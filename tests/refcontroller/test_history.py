"""The history query (protocol §6.6, ``refcontroller.history``): the fact log page by page, ended lifecycles
included; bounded pages and bounded work whatever the query asks; refused to who may not read it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from rc_client import memory_controller, on_mock_clock

from provisionerd.domain.model import (
    CommittedFact,
    Epoch,
    Fact,
    InstanceFact,
    OrphanReported,
    RequestIntent,
    Returned,
    ReturnIntent,
    Role,
)
from provisionerd.wire import codec
from provisionerd.wire.messages import ErrorMsg, Heartbeat, HeartbeatAck, HistoryPage, HistoryQuery, Rejected
from refcontroller import history
from refcontroller.paging import PAGE_BYTES, PAGE_ITEMS
from refcontroller.store import FactStore

E = Epoch(1, 1)


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lifecycle(provider: str, n: int, *, ended: bool = True) -> list[Fact]:
    """One machine's lifecycle: intent, instance and (when ``ended``) its return."""
    op, ref, machine = f"{provider}-r{n}", f"{provider}-i{n}", f"{provider}-m{n}"
    facts: list[Fact] = [
        RequestIntent(provider, E, op, "t", 1, (ref,), (_h(ref),), "d"),
        InstanceFact(provider, E, op, ref, machine, "t", _h(ref), launch_time=1000.0 + n),
    ]
    if ended:
        facts += [
            ReturnIntent(provider, E, f"{provider}-x{n}", (machine,), "idle"),
            Returned(provider, E, f"{provider}-x{n}", (machine,), at=5000.0 + n),
        ]
    return facts


def filled(store: FactStore, machines: int, providers: tuple[str, ...] = ("aws", "gcp")) -> list[CommittedFact]:
    """Interleaved lifecycles of ``providers``, most ended; every committed fact in log order."""
    for n in range(machines):
        for provider in providers:
            store.append_many(lifecycle(provider, n, ended=n % 5 != 0), "d")
    return list(store.all_facts())


def read_all(store: FactStore, query: HistoryQuery, providers: frozenset[str] | None) -> list[HistoryPage]:
    pages = []
    while True:
        page = history.history_page(store, query, providers)
        pages.append(page)
        if page.done:
            return pages
        assert page.next_after > query.after_index
        query = HistoryQuery(query.providers, page.next_after, page.until_index, query.max_facts)
        assert len(pages) < 10_000


@pytest.fixture
def mem() -> FactStore:
    store = FactStore.open(":memory:")
    yield store
    store.close()


def test_the_pages_hold_every_fact_ended_or_live_in_log_order(mem: FactStore) -> None:
    every = filled(mem, 300)  # 2 providers x 300 machines, 4/5 of them returned: 2,160 facts
    assert mem.live_count() < len(every) // 3  # most of the log has left the resync set
    pages = read_all(mem, HistoryQuery(), None)
    assert [c for p in pages for c in p.facts] == every
    assert all(len(p.facts) <= PAGE_ITEMS for p in pages) and len(pages) >= -(-len(every) // PAGE_ITEMS)
    assert all(len(codec.encode(p, 1)) <= PAGE_BYTES for p in pages)
    assert {p.until_index for p in pages} == {mem.last_index()} and [p.done for p in pages][-1]
    # One provider, a small page size, a range of indexes.
    aws = read_all(mem, HistoryQuery(("aws",), 100, 900, 7), frozenset({"aws"}))
    assert [c for p in aws for c in p.facts] == [c for c in every if c.fact.provider == "aws" and 100 < c.index <= 900]
    assert max(len(p.facts) for p in aws) == 7


def test_a_page_is_bounded_by_its_encoded_size_like_a_resync_page(mem: FactStore) -> None:
    big = "x" * 60_000  # four of these JSON documents pass the page's byte budget
    for n in range(12):
        mem.append(OrphanReported("aws", E, f"o{n}", f"m{n}", "ghost", json.dumps({"e": big})), "d")
    mem.append_many(lifecycle("aws", 1), "d")
    pages = read_all(mem, HistoryQuery(), None)
    assert [c for p in pages for c in p.facts] == list(mem.all_facts())
    assert len(pages) >= 6
    for page in pages:
        assert len(codec.encode(page, 1)) <= PAGE_BYTES + 1024, len(codec.encode(page, 1))


def test_a_hostile_cursor_or_a_huge_page_request_is_clamped(mem: FactStore) -> None:
    every = filled(mem, 200)
    last = mem.last_index()
    top = 2**64 - 1
    page = history.history_page(mem, HistoryQuery((), top, top, 2**32 - 1), None)
    assert (page.facts, page.next_after, page.until_index, page.done) == ((), last, last, True)
    page = history.history_page(mem, HistoryQuery((), 0, top, 2**32 - 1), None)
    # at most a page: 500 facts, or fewer when their encoded size reaches the page's 256 KiB first
    assert 400 < len(page.facts) <= PAGE_ITEMS and page.facts == tuple(every[: len(page.facts)])
    assert not page.done and page.until_index == last and len(codec.encode(page, 1)) <= PAGE_BYTES
    page = history.history_page(mem, HistoryQuery((), 30, 20), None)  # after above until: nothing, done
    assert page.facts == () and page.done
    page = history.history_page(mem, HistoryQuery(("nobody",), 0, 0), frozenset({"nobody"}))
    assert page.facts == () and page.done and page.next_after == last


@pytest.mark.sweep
def test_a_query_costs_the_same_in_a_short_log_and_a_long_one(tmp_path: Path) -> None:
    """Bounded work: the SQLite VM steps of one page do not grow with the log (ordered index scans, LIMIT)."""
    queries = [
        (HistoryQuery(), None),
        (HistoryQuery(("aws",)), frozenset({"aws"})),
        (HistoryQuery(("rare",)), frozenset({"rare"})),  # its 4 facts are the last of 4,000 or 40,000
        (HistoryQuery(("aws", "rare"), 2_000), frozenset({"aws", "rare"})),
    ]

    def steps(machines: int) -> list[int]:
        store = FactStore.open(tmp_path / f"f{machines}.sqlite")
        try:
            store.append_many([f for n in range(machines) for f in lifecycle("aws", n)], "d")
            store.append_many(lifecycle("rare", 1), "d")
            counted = [0]

            def tick() -> int:
                counted[0] += 1
                return 0

            store._conn.set_progress_handler(tick, 100)
            out = []
            for query, providers in queries:
                counted[0] = 0
                history.history_page(store, query, providers)
                out.append(counted[0])
            return out
        finally:
            store.close()

    short, long = steps(1_000), steps(10_000)
    assert all(b <= 2 * a + 10 for a, b in zip(short, long, strict=True)), (short, long)


def test_who_may_read_what() -> None:
    declared = ("aws", "gcp")
    assert history.readable(Role.ADMIN, (), HistoryQuery()) is None  # every provider
    assert history.readable(Role.ADMIN, (), HistoryQuery(("x",))) == {"x"}
    assert history.readable(Role.PROVISIONER, declared, HistoryQuery()) == {"aws", "gcp"}
    assert history.readable(Role.PROVISIONER, declared, HistoryQuery(("gcp",))) == {"gcp"}
    for role, query in [
        (Role.PROVISIONER, HistoryQuery(("aws", "azure"))),  # not its own
        (Role.WORKER, HistoryQuery()),
        (Role.CONTROLLER, HistoryQuery()),
        (Role.ADMIN, HistoryQuery(tuple(f"p{i}" for i in range(history.MAX_QUERY_PROVIDERS + 1)))),
    ]:
        with pytest.raises(history.HistoryRefused):
            history.readable(role, declared, query)


@on_mock_clock
async def test_the_session_answers_and_refuses_history_queries(tmp_path: Path) -> None:
    async with memory_controller(tmp_path) as h:
        every = filled(h.cluster.store, 150)
        prov, reply = await h.join(Role.PROVISIONER, "prov", providers=("aws",), instance="abc")
        assert reply.accepted, reply  # type: ignore[union-attr]
        got: list[CommittedFact] = []
        after = until = 0
        while True:
            page = await prov.request(HistoryQuery((), after, until))
            assert isinstance(page, HistoryPage)
            got += page.facts
            if page.done:
                break
            after, until = page.next_after, page.until_index
        assert got == [c for c in every if c.fact.provider == "aws"]
        # Another provider's history: refused, counted, and the link stays up.
        refused = await prov.request(HistoryQuery(("gcp",)))
        assert isinstance(refused, Rejected) and refused.reason == "invalid" and "gcp" in refused.detail
        assert h.server.stats["history_refused"] == 1
        assert isinstance(await prov.request(Heartbeat(1)), HeartbeatAck)
        # An admin reads every provider.
        admin, _ = await h.join(Role.ADMIN, "ops")
        page = await admin.request(HistoryQuery((), 0, 0, 3))
        assert isinstance(page, HistoryPage) and page.facts == tuple(every[:3]) and not page.done
        # A worker may not send it at all: refused on its kind, the connection closed.
        worker, joined = await h.join(Role.WORKER, "w", instance_ref="aws-i0", token="aws-i0")  # live: n % 5 == 0
        assert joined.accepted, joined  # type: ignore[union-attr]
        answer = await worker.request(HistoryQuery())
        assert isinstance(answer, ErrorMsg) and answer.code == "not_allowed"
        assert await worker.closed()
