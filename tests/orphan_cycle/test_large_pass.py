"""A large orphan pass classifies in a worker thread on a snapshot of the view (``orphan_cycle.classify_off_loop``):
the same result as inline, and the session may go on folding facts into the live view meanwhile."""

from __future__ import annotations

import gc
import threading

import pytest
import trio
import trio.lowlevel
from cycle_world import World, tags
from rigs.clock import mock_run

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_EPOCH,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    CommittedFact,
    Epoch,
    InstanceFact,
    ProviderMachine,
    RequestIntent,
)
from provisionerd.execution import orphan_offload
from provisionerd.execution.orphan_offload import OFF_LOOP_AT, SNAPSHOT_TRIES, classify_off_loop, view_snapshot
from provisionerd.orphans.classify import ClassifierMemory, OrphanPolicy, classify
from provisionerd.orphans.model import ControllerState, LeaseState, Observation
from provisionerd.planner.fact_view import FactView, fold

NOW = 1_800_000_000.0
EPOCH = Epoch(1, 1)


def world(machines: int, listed_extra: int) -> Observation:
    facts: list[CommittedFact] = []
    listing = []
    for op in range(machines // 10):
        op_id = f"c:p:0:{op}"
        refs = tuple(f"ref-{op}-{j}" for j in range(10))
        facts.append(CommittedFact(len(facts) + 1, RequestIntent("p", EPOCH, op_id, "t", 10, refs, ("0" * 64,) * 10)))
        for ref in refs:
            machine_id = f"m-{ref}"
            facts.append(
                CommittedFact(
                    len(facts) + 1,
                    InstanceFact("p", EPOCH, op_id, ref, machine_id, "t", "0" * 64, launch_time=NOW - 60),
                )
            )
            tags = {TAG_CLUSTER: "c", TAG_PROVIDER: "p", TAG_OP: op_id, TAG_EPOCH: str(EPOCH), TAG_INSTANCE: ref}
            listing.append(ProviderMachine(machine_id, "", "succeed", "running", NOW - 60, "", ref, tags))
    for n in range(listed_extra):  # tagged for us, no fact: orphans
        tags = {TAG_CLUSTER: "c", TAG_PROVIDER: "p", TAG_OP: "c:p:0:gone", TAG_EPOCH: str(EPOCH)}
        listing.append(ProviderMachine(f"x-{n}", "", "succeed", "running", NOW - 7200, "", "", tags))
    view = FactView()
    fold(facts, view)
    return Observation(
        cluster_id="c",
        provider="p",
        now=NOW,
        listing=tuple(listing),
        view=view,
        lease=LeaseState(held=True, epoch=EPOCH),
        controller=ControllerState(primary=True, settled=True),
    )


def recording(monkeypatch) -> list[tuple[int, object]]:
    """Each classify call's thread and view, through the module's own name for it."""
    calls: list[tuple[int, object]] = []

    def spy(obs, policy, memory=None):
        calls.append((threading.get_ident(), obs.view))
        return classify(obs, policy, memory)

    monkeypatch.setattr(orphan_offload, "classify", spy)
    return calls


def test_a_large_pass_classifies_off_the_loop_on_a_snapshot_with_the_same_result(monkeypatch):
    obs = world(OFF_LOOP_AT, 7)
    inline = classify(obs, OrphanPolicy(), ClassifierMemory())
    assert len(inline.findings) == 7
    calls = recording(monkeypatch)
    off_loop = trio.run(classify_off_loop, obs, OrphanPolicy(), ClassifierMemory())
    assert off_loop.findings == inline.findings and off_loop.allowed == inline.allowed
    ((thread, view),) = calls
    assert thread != threading.get_ident()  # a worker thread, not the loop's
    assert view is not obs.view and view.machines == obs.view.machines  # a snapshot of the live view
    assert view.machines is not obs.view.machines and view.intents is not obs.view.intents


def _more(view: FactView, op: int) -> None:
    """Fold one more op of one machine into ``view`` (a fact arriving while a snapshot is copied)."""
    op_id, ref = f"c:p:9:{op}", f"late-{op}"
    index = view.last_index
    fold(
        [
            CommittedFact(index + 1, RequestIntent("p", EPOCH, op_id, "t", 1, (ref,), ("0" * 64,))),
            CommittedFact(index + 2, InstanceFact("p", EPOCH, op_id, ref, f"m-{ref}", "t", "0" * 64)),
        ],
        view,
    )


def test_a_snapshot_is_copied_a_chunk_a_step_and_is_the_view_of_one_moment():
    view = world(1000, 0).view
    assert isinstance(view, FactView)
    steps = []

    async def main():
        async def fold_between_steps():
            # Folds a fact at each of the first two steps the copy yields: both copies begun are abandoned.
            for op in range(2):
                await trio.lowlevel.checkpoint()
                steps.append(len(view.machines))
                _more(view, op)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fold_between_steps)
            return await view_snapshot(view, chunk=300)

    snap = trio.run(main)
    assert steps == [1000, 1001]  # the folder ran between the copy's steps
    assert snap.machines == view.machines and list(snap.machines) == list(view.machines)  # all, in the view's order
    assert snap.intents == view.intents and snap.last_index == view.last_index
    assert snap.machines is not view.machines and snap.intents is not view.intents
    assert "m-late-1" in snap.machines  # the copy that completed began after the last fact


def test_a_snapshot_taken_while_facts_keep_arriving_is_taken_in_one_step_after_its_tries():
    view = world(1000, 0).view
    assert isinstance(view, FactView)

    folded = [0]

    async def main():
        async def fold_forever():
            for op in range(10_000):  # a fact at every step: no copy of more than one step completes
                await trio.lowlevel.checkpoint()
                _more(view, op)
                folded[0] += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fold_forever)
            snap = await view_snapshot(view, chunk=300)
            nursery.cancel_scope.cancel()
            return snap, folded[0]

    snap, by_then = trio.run(main)
    assert SNAPSHOT_TRIES <= by_then <= 2 * SNAPSHOT_TRIES + 1  # a fact or two a try (trio orders a batch at random)
    assert len(snap.machines) == 1000 + by_then  # every fact folded before it
    assert list(snap.machines.items()) == list(view.machines.items())[: len(snap.machines)]


def test_a_small_pass_stays_inline(monkeypatch):
    obs = world(100, 1)
    calls = recording(monkeypatch)

    async def main():
        # No checkpoint at all: inline (a thread would be a checkpoint, and MockClock tests rely on none).
        with trio.CancelScope() as scope:
            scope.cancel()
            return await classify_off_loop(obs, OrphanPolicy(), ClassifierMemory())

    assert len(trio.run(main).findings) == 1
    assert calls == [(threading.get_ident(), obs.view)]


def test_the_collector_pauses_for_large_blocks_only_and_resumes_when_the_last_overlapping_one_ends():
    assert gc.isenabled()
    with orphan_offload.collector_paused(False):
        assert gc.isenabled()
    first, second = orphan_offload.collector_paused(True), orphan_offload.collector_paused(True)
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()  # another provider's pass, overlapping
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second still holds its listing
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()  # paused by someone else before: left as it was
    try:
        with orphan_offload.collector_paused(True):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), orphan_offload.collector_paused(True):
        raise RuntimeError("a pass that fails")
    assert gc.isenabled()


def test_a_large_pass_reads_and_classifies_with_the_collector_paused_and_acts_with_it_running(monkeypatch):
    world = World().machine("i-stray", tags("op-stray"))
    seen: dict[str, bool] = {}
    listing = world.provider.call

    async def call(action, input, *, timeout=None):
        if action == "listMachines":
            seen["listing"] = gc.isenabled()
        return await listing(action, input, timeout=timeout)

    def spy(obs, policy, memory=None):
        seen["classify"] = gc.isenabled()
        return classify(obs, policy, memory)

    monkeypatch.setattr(world.provider, "call", call)
    monkeypatch.setattr(orphan_offload, "classify", spy)
    cycle = world.cycle(OrphanPolicy(orphan_action="terminate"), fleet_floor=OFF_LOOP_AT)
    returns = cycle.fake_executor.return_machines

    async def returning(*args, **kwargs):
        seen["action"] = gc.isenabled()
        return await returns(*args, **kwargs)

    monkeypatch.setattr(cycle.fake_executor, "return_machines", returning)
    result = mock_run(cycle.run_pass)
    assert [a.outcome for a in result.actions] == ["ok"]
    assert seen == {"listing": False, "classify": False, "action": True}
    assert gc.isenabled()
    # A small fleet's pass leaves the collector alone.
    seen.clear()
    small = World().machine("i-other", tags("op-other"))
    monkeypatch.setattr(small.provider, "call", call)
    mock_run(small.cycle().run_pass)
    assert seen == {"listing": True, "classify": True}
