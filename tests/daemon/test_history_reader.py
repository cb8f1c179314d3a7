"""The daemon's reader of the history query (``controller.history``): it follows the cursor with the bound the first
page fixed, and abandons a controller whose answers make no sense instead of looping or trusting them."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from provisionerd.controller.history import HistoryUnreadable, history_pages, recent_facts
from provisionerd.domain.model import CommittedFact, Epoch, Lost
from provisionerd.wire.messages import Ack, HistoryPage, HistoryQuery, Message


def fact(index: int) -> CommittedFact:
    return CommittedFact(index, Lost("aws", Epoch(1, 1), f"op{index}", f"m{index}", "gone"))


class Scripted:
    """A stand-in for the session: answers each request with the next scripted reply, recording the queries."""

    def __init__(self, replies: list[Message]) -> None:
        self.replies = replies
        self.queries: list[HistoryQuery] = []
        self.generation = 1  # joined once ...
        self.controller_history = True  # ... a controller that announced the query (JoinReply.history)

    async def request(self, msg: Message, *, timeout: float | None = None) -> Message:
        assert isinstance(msg, HistoryQuery)
        self.queries.append(msg)
        return self.replies.pop(0)


def read(session: Scripted, **kwargs: Any) -> list[HistoryPage]:
    async def main() -> list[HistoryPage]:
        return [page async for page in history_pages(session, **kwargs)]  # type: ignore[arg-type]

    return trio.run(main)


def test_the_reader_follows_the_cursor_with_the_first_pages_bound() -> None:
    session = Scripted(
        [
            HistoryPage((fact(1), fact(2)), 2, 9, False),
            HistoryPage((fact(5),), 5, 9, False),
            HistoryPage((), 9, 9, True),
        ]
    )
    pages = read(session, providers=("aws",))
    assert [c.index for p in pages for c in p.facts] == [1, 2, 5]
    assert [(q.after_index, q.until_index) for q in session.queries] == [(0, 0), (2, 9), (5, 9)]
    assert {q.providers for q in session.queries} == {("aws",)}


@pytest.mark.parametrize(
    "replies",
    [
        [Ack()],  # not a page
        [HistoryPage((fact(1),), 1, 9, False), HistoryPage((), 1, 9, False)],  # the cursor does not move
        [HistoryPage((fact(4),), 4, 9, False), HistoryPage((fact(2),), 2, 9, False)],  # it goes back
        [HistoryPage((fact(4),), 4, 9, False), HistoryPage((fact(10),), 10, 12, False)],  # past the fixed bound
        [HistoryPage((fact(3), fact(12)), 12, 9, True)],  # a fact above the page's own bound
    ],
    ids=["not_a_page", "stuck", "back", "past_the_bound", "outside"],
)
def test_nonsense_from_the_controller_abandons_the_read(replies: list[Message]) -> None:
    with pytest.raises(HistoryUnreadable):
        read(Scripted(replies))


def test_a_history_that_never_ends_is_abandoned_at_the_page_bound() -> None:
    session = Scripted([HistoryPage((fact(i),), i, 10**9, False) for i in range(1, 50)])
    with pytest.raises(HistoryUnreadable, match="within 5 pages"):
        read(session, max_pages=5)
    assert len(session.queries) == 5


def test_the_admin_history_command_answers_one_page_as_json_and_refuses_bad_fields() -> None:
    import json

    from provisionerd.daemon.history_admin import history_command
    from provisionerd.domain.model import InstanceFact, PriceQuote

    usd = PriceQuote(0.5, "USD", "hour", "sim", "2026-01-01T00:00:00Z")
    made = CommittedFact(7, InstanceFact("aws", Epoch(1, 1), "op", "r", "m", "t", "h", launch_time=5.0, price=usd))
    session = Scripted([HistoryPage((made,), 7, 9, False)])
    command = history_command(session)  # type: ignore[arg-type]

    async def main() -> list[dict[str, Any]]:
        out = [await command.run({"cmd": "history", "after": 6, "until": 9, "limit": 1}, None)]
        for bad in ({"after": -1}, {"until": "9"}, {"limit": 10**6}, {"after": True}):
            out.append(await command.run({"cmd": "history", **bad}, None))
        return out

    answered, *refused = trio.run(main)
    assert answered == {
        "ok": True,
        "facts": [json.loads(json.dumps(answered["facts"][0]))],
        "next_after": 7,
        "until_index": 9,
        "done": False,
    }
    (doc,) = answered["facts"]
    assert (doc["index"], doc["kind"], doc["machine_id"], doc["price"]["amount"]) == (7, "InstanceFact", "m", 0.5)
    assert session.queries == [HistoryQuery((), 6, 9, 1)]
    assert all(r["ok"] is False and "must be an integer" in r["error"] for r in refused)


def test_a_controller_that_did_not_announce_the_query_is_never_sent_one() -> None:
    """An older controller (``JoinReply.history`` false) would close the link on a ``HistoryQuery`` it cannot
    decode: the reader refuses locally, typed, and sends nothing; the admin command says so and names ``--live``."""
    import json

    from provisionerd.controller.history import HistoryNotServed
    from provisionerd.daemon.history_admin import history_command

    older = Scripted([HistoryPage((), 9, 9, True)])
    older.controller_history = False
    with pytest.raises(HistoryNotServed, match="JoinReply.history"):
        read(older)
    answer = trio.run(history_command(older).run, {"after": 0}, None)  # type: ignore[arg-type]
    assert answer["ok"] is False and "does not serve the history query" in answer["error"]
    assert older.queries == []  # nothing went on the wire
    json.dumps(answer)


class Log:
    """A stand-in session over a fact log of 1..n whose fact i was committed at ``10 * i``: each query is answered
    with every fact in its range, in one page."""

    def __init__(self, n: int) -> None:
        self.log = [attrs.evolve(fact(i), committed_at=10.0 * i) for i in range(1, n + 1)]
        self.queries: list[HistoryQuery] = []
        self.generation = 1
        self.controller_history = True

    async def request(self, msg: Message, *, timeout: float | None = None) -> Message:
        assert isinstance(msg, HistoryQuery)
        self.queries.append(msg)
        inside = tuple(c for c in self.log if msg.after_index < c.index <= msg.until_index)
        return HistoryPage(inside, msg.until_index, msg.until_index, True)


def recent(session: Log, since: float, **kwargs: Any) -> list[CommittedFact]:
    async def main() -> list[CommittedFact]:
        return await recent_facts(session, ("aws",), since, len(session.log), **kwargs)  # type: ignore[arg-type]

    return trio.run(main)


def test_recent_facts_reads_back_from_the_end_only_as_far_as_the_window() -> None:
    """The health windows' read (``planner.windows``): the facts committed since a time, read backwards a chunk at
    a time from the log's end, stopping at the first chunk that reaches older ones, and at ``max_facts``."""
    session = Log(100)
    found = recent(session, 905.0, chunk=20)  # facts 91..100 are committed at or after 905 s
    assert [c.index for c in found] == list(range(91, 101))
    assert [(q.after_index, q.until_index) for q in session.queries] == [(80, 100)]  # one chunk was enough
    session = Log(100)
    assert [c.index for c in recent(session, 505.0, chunk=20)] == list(range(51, 101))
    assert [q.after_index for q in session.queries] == [80, 60, 40]
    session = Log(100)
    assert len(recent(session, 0.0, chunk=20, max_facts=30)) == 40  # bounded: two chunks, not five
