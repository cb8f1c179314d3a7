"""The one record per op (``execution.op_book``): claims never overlap, records stay bounded by the open ops and the
running ones, a failing return backs off, and ``describe`` shows each op's stage (MockClock, hypothesis)."""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from provisionerd.execution.op_book import DESCRIBE_MAX, OpBook, Stage
from provisionerd.planner.state import ActionDropped


def on_clock(fn: Callable[[], object]) -> object:
    async def main() -> object:
        return fn()

    return trio.run(main, clock=trio.testing.MockClock())


OPS = st.sampled_from([f"op-{i}" for i in range(5)])
MACHINES = st.lists(st.sampled_from([f"m-{i}" for i in range(6)]), max_size=3, unique=True)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), OPS, MACHINES),
        st.tuples(st.just("release"), OPS, st.just([])),
        st.tuples(st.just("keep"), st.sets(OPS), st.just([])),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_no_two_running_ops_share_an_op_id_or_a_machine_and_the_book_stays_bounded(steps: list) -> None:
    def run() -> None:
        book = OpBook()
        held: dict[str, object] = {}
        for what, arg, machines in steps:
            if what == "claim":
                record = book.claim(arg, "return", "p", machines)
                taken = {m for op, r in held.items() for m in r.machines}  # type: ignore[attr-defined]
                if arg in held or taken & set(machines):
                    assert record is None
                else:
                    assert record is not None and record.running and record.stage is Stage.PLANNED
                    held[arg] = record
            elif what == "release" and arg in held:
                book.release(held.pop(arg))  # type: ignore[arg-type]
            elif what == "keep":
                book.keep(arg)
                assert len(book) <= len(arg | set(held))
            assert book.running_ops == set(held)
            assert book.busy_machines == {m for r in held.values() for m in r.machines}  # type: ignore[attr-defined]

    on_clock(run)


def test_a_released_op_is_idle_unless_settled_and_observations_reach_the_sink() -> None:
    def run() -> None:
        sent: list[object] = []
        book = OpBook(sent.append)
        record = book.claim("op-1", "request", "p")
        assert record is not None and book.claim("op-1", "request", "p") is None
        record.enter(Stage.POLLING)
        record.add(ActionDropped("op-1"))
        assert sent == [ActionDropped("op-1")] and record.take_observations() == (ActionDropped("op-1"),)
        book.release(record)
        assert record.stage is Stage.IDLE and not book.settled("op-1")
        again = book.claim("op-1", "request", "p")
        assert again is record
        book.settle(again)
        book.release(again)
        assert again.stage is Stage.SETTLED and book.settled("op-1")
        book.keep(set())
        assert book.get("op-1") is None

    on_clock(run)


def test_a_failing_return_backs_off_and_a_success_forgets_its_failures() -> None:
    def run() -> None:
        book = OpBook()
        record = book.claim("ret-1", "return", "p", ["m-1"])
        assert record is not None
        delays = [book.note_return("ret-1", True, lambda n: 10.0 * 2 ** (n - 1)) for _ in range(3)]
        assert delays == [1, 2, 3] and record.retry_at == trio.current_time() + 40.0
        assert book.failing_returns() == {"ret-1": 3}
        assert book.note_return("ret-1", False, lambda n: 1.0) == 0 and book.failing_returns() == {}
        assert book.note_return("unknown-op", True, lambda n: 1.0) == 0

    on_clock(run)


def test_describe_names_each_op_with_its_stage_and_stays_bounded() -> None:
    def run() -> dict:
        book = OpBook()
        for i in range(DESCRIBE_MAX + 5):
            book.claim(f"op-{i:04d}", "request", "p")
        first = book.get("op-0000")
        assert first is not None
        first.enter(Stage.CALLING)
        return book.describe()

    shown: dict = on_clock(run)  # type: ignore[assignment]
    assert shown["count"] == DESCRIBE_MAX + 5 and shown["running"] == DESCRIBE_MAX + 5
    assert len(shown["ops"]) == DESCRIBE_MAX
    [first] = [o for o in shown["ops"] if o["op_id"] == "op-0000"]
    assert (first["stage"], first["kind"], first["running"]) == ("calling", "request", True)
