"""The recovery of a request op after a restart, as a pure function, driven over every step at which a process can
die (issue 31 item 2): ``provisionerd.execution.recovery_rules``."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from provisionerd.execution.recovery_rules import (
    CallRecord,
    OpAtRestart,
    RecoveryStep,
    Step,
    recover_request,
    unexplained,
)

#: Where the op was when the process died: before the call, while it ran, after its answer (during the poll), part
#: way through committing the instance facts, after the last fact.
DIED = ("intent_committed", "calling", "answered", "polling", "some_facts", "all_facts")


@st.composite
def op_at_restart(draw: st.DrawFn) -> tuple[OpAtRestart, set[str], str]:
    """An op, the machines that really exist (refs), and the step at which the process died."""
    count = draw(st.integers(1, 6))
    refs = tuple(f"op/i-{i}" for i in range(count))
    died = draw(st.sampled_from(DIED))
    legacy = draw(st.booleans())
    made_n = 0 if died == "intent_committed" else draw(st.integers(0, count))  # a call may make fewer (partial)
    made = set(refs[:made_n])
    committed: set[str] = set()
    if died == "some_facts":
        committed = set(draw(st.lists(st.sampled_from(sorted(made)), unique=True))) if made else set()
    elif died == "all_facts":
        committed = set(made)
    if legacy:
        if died == "calling":
            call = draw(st.sampled_from([CallRecord.RUNNING, CallRecord.UNKNOWN, CallRecord.KNOWN]))
        else:
            call = CallRecord.KNOWN
    else:
        call = CallRecord.RUNNING if died == "calling" and draw(st.booleans()) else CallRecord.KNOWN
    listed = draw(st.booleans())
    listing_ok = draw(st.booleans())
    # A listing read after the call shows what exists (in any order, maybe repeated); a vanished machine is simply
    # not made here.
    listing = tuple(draw(st.permutations(sorted(made)))) if listed and listing_ok else None
    op = OpAtRestart(count, refs, frozenset(committed), call, listing, listed)
    return op, made, died


@settings(max_examples=500, deadline=None)
@given(op_at_restart())
def test_recovery_never_leaves_a_machine_without_a_fact_nor_fails_what_exists(case) -> None:
    op, made, died = case
    step = recover_request(op)
    if op.call is CallRecord.RUNNING:
        assert step == RecoveryStep(Step.WAIT)  # the call's answer decides: nothing failed meanwhile
        return
    if op.call is CallRecord.UNKNOWN:
        assert step.step is Step.FAIL_UNKNOWN  # legacy, nothing can list it: failed, reported, never retried
        return
    if not op.listed:
        assert step.step is Step.LIST and not step.fails
        return
    if op.listing is None:
        assert step.step is Step.RETRY_LATER and not step.fails
        return
    assert step.step is Step.SETTLE
    assert not unexplained(made, op.committed, step), (died, step)  # every machine that exists gets its fact
    assert set(step.commit).isdisjoint(op.committed)  # committed once
    assert step.shortfall == op.count - len(made | set(op.committed))  # failed only for what does not exist
    if len(made) == op.count:
        assert not step.fails


def test_the_listing_ignores_machines_of_other_refs_and_repeats() -> None:
    op = OpAtRestart(2, ("a", "b"), frozenset({"a"}), listing=("a", "x", "b", "b"), listed=True)
    assert recover_request(op) == RecoveryStep(Step.SETTLE, ("b",), 0)


def test_a_partial_listing_fails_only_the_rest() -> None:
    op = OpAtRestart(3, ("a", "b", "c"), listing=("c",), listed=True)
    assert recover_request(op) == RecoveryStep(Step.SETTLE, ("c",), 2)
