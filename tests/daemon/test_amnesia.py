"""Controller amnesia on the daemon's side: the pure rules (hypothesis), the state file, and the guard's halt as the
gate and the lease keeper see it (MockClock)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import hypothesis.strategies as st
import pytest
import trio
from hypothesis import given

from provisionerd.controller import amnesia
from provisionerd.controller.amnesia import ControllerMemory
from provisionerd.controller.amnesia_guard import AmnesiaGuard
from provisionerd.controller.lease import LeaseGranted, LeaseState
from provisionerd.controller.memory_file import InMemory, StateFile
from provisionerd.domain.errors import MutationsHalted, StateFileDamaged
from provisionerd.domain.model import NO_EPOCH, Epoch, RequestIntent
from provisionerd.execution.gate import MutationGate
from provisionerd.telemetry.events import EventLog

incarnations = st.text("0123456789abcdef", min_size=1, max_size=8)
epochs = st.builds(Epoch, st.integers(1, 5), st.integers(1, 5))
providers = st.sampled_from(["a", "b", "c"])


@st.composite
def honest_histories(draw):  # type: ignore[no-untyped-def]
    """What one controller incarnation says over time: joins with a growing last index, grants with growing
    epochs per provider (sometimes the same epoch again to the same process start), acks of growing indexes."""
    incarnation = draw(incarnations)
    steps, index, highest = [], 0, {}
    for kind in draw(st.lists(st.sampled_from(["join", "ack", "grant", "regrant"]), max_size=30)):
        if kind == "join":
            index += draw(st.integers(0, 3))
            steps.append(("join", incarnation, index))
        elif kind == "ack":
            index += draw(st.integers(1, 3))
            steps.append(("ack", index))
        else:
            provider = draw(providers)
            if kind == "regrant" and provider in highest:
                steps.append(("grant", provider, highest[provider], highest[provider]))
                continue
            old = highest.get(provider, Epoch(0, 0))
            epoch = draw(epochs.filter(lambda e, old=old: e > old))
            highest[provider] = epoch
            steps.append(("grant", provider, epoch, None))
    return steps


@given(honest_histories())
def test_a_controller_that_forgets_nothing_is_never_suspected(steps) -> None:  # type: ignore[no-untyped-def]
    memory = ControllerMemory()
    for step in steps:
        if step[0] == "join":
            assert amnesia.judge_join(memory, step[1], step[2]) is None
            memory = amnesia.joined(memory, step[1])
        elif step[0] == "ack":
            memory = amnesia.acknowledged(memory, step[1])
        else:
            _, provider, epoch, held = step
            assert amnesia.judge_grant(memory, provider, epoch, held) is None
            memory = amnesia.granted(memory, provider, epoch)


@given(incarnations, incarnations, st.integers(0, 100), st.integers(0, 100))
def test_another_incarnation_or_none_is_amnesia(remembered, said, acked, last) -> None:  # type: ignore[no-untyped-def]
    memory = ControllerMemory(incarnation=remembered, last_index=acked)
    finding = amnesia.judge_join(memory, said, last)
    if said != remembered:
        assert finding is not None and finding.reason == amnesia.INCARNATION_CHANGED
    elif last < acked:
        assert finding is not None and finding.reason == amnesia.LAST_INDEX_BEHIND
    else:
        assert finding is None
    unknown = amnesia.judge_join(memory, "", last)  # empty = unknown, never "the same"
    assert unknown is not None and unknown.reason == amnesia.INCARNATION_CHANGED
    if finding is not None:  # the admin's decision remembers the controller as it is: the same join passes
        assert amnesia.judge_join(amnesia.accept_reset(finding), said, last) is None


@given(st.integers(0, 50), st.integers(0, 50))
def test_a_lower_last_index_is_amnesia_even_from_an_old_controller(acked, last) -> None:  # type: ignore[no-untyped-def]
    memory = ControllerMemory(incarnation="", last_index=acked)
    finding = amnesia.judge_join(memory, "", last)  # an older controller: no incarnation, lastIndex reads as 0
    assert (finding is not None) == (last < acked)
    if finding is not None:
        assert finding.reason == amnesia.LAST_INDEX_BEHIND and str(acked) in finding.detail


@given(providers, epochs, epochs, st.sampled_from(["none", "same", "other"]))
def test_an_epoch_not_above_the_highest_is_amnesia_unless_this_start_held_it(  # type: ignore[no-untyped-def]
    provider, highest, epoch, held
) -> None:
    memory = ControllerMemory(incarnation="x", epochs={provider: highest})
    held_this_start = {"none": None, "same": epoch, "other": highest}[held]
    finding = amnesia.judge_grant(memory, provider, epoch, held_this_start)
    legitimate = epoch > highest or (epoch == highest and held_this_start == epoch)
    assert (finding is None) == legitimate
    if finding is not None:
        assert finding.reason == amnesia.EPOCH_REGRANTED and finding.epoch == epoch
        assert amnesia.judge_grant(amnesia.accept_reset(finding), provider, epoch, None) is None


@given(st.lists(st.integers(0, 1000)), st.lists(st.tuples(providers, epochs)))
def test_the_memory_only_grows(indexes, grants) -> None:  # type: ignore[no-untyped-def]
    memory = ControllerMemory()
    for index in indexes:
        before = memory.last_index
        memory = amnesia.acknowledged(memory, index)
        assert memory.last_index == max(before, index)
    for provider, epoch in grants:
        before_epoch = memory.epochs.get(provider)
        memory = amnesia.granted(memory, provider, epoch)
        assert memory.epochs[provider] == (epoch if before_epoch is None else max(before_epoch, epoch))


# --- the state file ------------------------------------------------------------------------------------------------


def test_the_state_file_round_trips_atomically_with_private_modes(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    state = StateFile(directory / "controller.c1.json", "c1")
    assert state.load() == ControllerMemory()  # no file yet: never joined
    memory = ControllerMemory("abc", 6, {"aws": Epoch(3, 2)})
    state.save(memory)
    assert state.load() == memory
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert os.stat(state.path).st_mode & 0o777 == 0o600
    assert json.loads(state.path.read_text()) == {
        "version": 1,
        "cluster": "c1",
        "incarnation": "abc",
        "last_index": 6,
        "epochs": {"aws": "3.2"},
    }
    assert [p.name for p in directory.iterdir()] == ["controller.c1.json"]  # no temporary file left


@pytest.mark.parametrize(
    "text, why",
    [
        ("{not json", "Expecting property name"),
        ("[]", "not a JSON object"),
        ('{"version": 2}', "version 2"),
        ('{"version": 1, "cluster": "other", "incarnation": "", "last_index": 0, "epochs": {}}', "cluster 'other'"),
        ('{"version": 1, "cluster": "c1", "incarnation": "", "last_index": -1, "epochs": {}}', "non-negative"),
        ('{"version": 1, "cluster": "c1", "incarnation": "", "last_index": 0, "epochs": {"a": "x"}}', "epoch must"),
        ('{"version": 1, "cluster": "c1", "incarnation": "", "last_index": 0}', "epochs"),
    ],
)
def test_a_damaged_state_file_is_a_typed_error_never_a_reset(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "controller.c1.json"
    path.write_text(text)
    with pytest.raises(StateFileDamaged, match=why) as caught:
        StateFile(path, "c1").load()
    assert caught.value.path == str(path) and str(path) in str(caught.value)
    with pytest.raises(StateFileDamaged):  # the guard loads it at construction: the daemon does not start
        AmnesiaGuard(StateFile(path, "c1"), EventLog())


# --- the guard, the gate and the keeper ------------------------------------------------------------------------------


def test_a_join_from_another_incarnation_halts_until_the_admin_accepts(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "controller.c1.json", "c1")
    events = EventLog()
    guard = AmnesiaGuard(state, events)
    assert guard.check_join("one", 0) is None
    guard.note_acknowledged(6)
    guard.note_granted("aws", Epoch(2, 1))
    assert AmnesiaGuard(state, EventLog()).memory == ControllerMemory("one", 6, {"aws": Epoch(2, 1)})  # persisted

    finding = guard.check_join("two", 0)
    assert finding is not None and finding.reason == amnesia.INCARNATION_CHANGED
    assert guard.alarms == 1
    assert guard.halted is not None and "incarnation 'two', not 'one'" in guard.halted
    (event,) = [e for e in events.recent if e["event"] == "controller_amnesia"]
    assert event["reason"] == "incarnation_changed" and event["remembered"]["last_index"] == 6
    # While halted nothing the controller says is remembered, and a join that looks fine does not end the halt.
    guard.note_acknowledged(100)
    assert guard.check_join("one", 6) is finding and guard.memory.last_index == 6
    assert guard.status()["halted"] and guard.status()["finding"]["incarnation"] == "two"

    reply = guard.accept_reset("root (uid 0)")
    assert reply["ok"] and reply["memory"] == {"incarnation": "two", "last_index": 0, "epochs": {}}
    assert guard.halted is None and AmnesiaGuard(state, EventLog()).memory == ControllerMemory("two", 0)
    assert guard.check_join("two", 0) is None
    assert not guard.accept_reset("root")["ok"]  # nothing left to accept


class _Committer:
    def __init__(self) -> None:
        self.commits: list[object] = []

    async def commit(self, fact: object) -> int:
        self.commits.append(fact)
        return len(self.commits)


class _Granting:
    """A lease transport that grants ``epoch`` on every acquire and renewal."""

    def __init__(self, epoch: Epoch) -> None:
        self.epoch = epoch

    async def wait_ready(self) -> None:
        pass

    async def acquire(self, provider: str) -> LeaseGranted:
        return LeaseGranted(self.epoch, 30.0)

    async def renew(self, provider: str, epoch: Epoch) -> LeaseGranted:
        return LeaseGranted(self.epoch, 30.0)

    async def release(self, provider: str, epoch: Epoch) -> None:
        pass


def test_an_epoch_granted_again_halts_the_keeper_and_the_gate_refuses(mock_run, make_keeper) -> None:  # type: ignore[no-untyped-def]
    """The daemon remembers epoch 2.1 for aws; a controller that grants 2.1 again (to a new process start) is
    refused at the keeper, every lease lapses, and the gate refuses before committing anything."""
    guard = AmnesiaGuard(InMemory(ControllerMemory("x", 4, {"aws": Epoch(2, 1)})), EventLog())
    events = EventLog()
    committer = _Committer()

    async def main() -> None:
        aws = make_keeper("aws", _Granting(Epoch(2, 1)), events, judge=guard)
        gpu = make_keeper("gpu", _Granting(Epoch(5, 1)), events, judge=guard)
        gate = MutationGate({"aws": aws, "gpu": gpu}, committer, events, halted=lambda: guard.halted)
        async with trio.open_nursery() as nursery:
            await nursery.start(gpu.run)
            await gpu.wait_valid()  # 5.1 is above anything remembered: held
            await nursery.start(aws.run)
            await trio.sleep(1.0)
            assert guard.finding is not None and guard.finding.reason == amnesia.EPOCH_REGRANTED
            assert aws.state is LeaseState.NONE and "controller amnesia" in aws.reason
            assert gpu.state is LeaseState.LAPSED  # halted with everyone else
            intent = RequestIntent("gpu", NO_EPOCH, "op-1", "t", 1, ("i-1",), ("h",))
            with pytest.raises(MutationsHalted, match="mutations halted for provider 'gpu': controller amnesia"):
                async with gate.mutation("gpu", intent):
                    raise AssertionError("the body must not run")
            assert committer.commits == [] and gate.halted_refusals == 1
            assert [d.outcome for d in gate.decisions] == ["halted"]
            denied = [e for e in events.recent if e["event"] == "lease_denied"]
            assert denied and denied[0]["reason"] == "controller_amnesia"
            nursery.cancel_scope.cancel()

    mock_run(main)
