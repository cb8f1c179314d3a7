"""Large orphan passes off the event loop: at 100k machines, classifying (~0.25-0.5 s of pure Python) and freeing
the listing (~30-50 ms of deallocation) would each hold the loop in one step, stalling heartbeats and lease
renewals. Both run in a worker thread instead, where the interpreter hands the loop the GIL every switch
interval (5 ms). Small passes (every test on trio's ``MockClock``, the simulation) stay inline and deterministic.

While a large pass holds its listing the cyclic collector is paused (``collector_paused``): the listing's 100k
machines (no reference cycles among them: their reference counts free them) would otherwise each time the young
generations overflow make a full collection walk them all, 30-70 ms in one loop step, several times a pass.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator
from typing import Any

import attrs
import trio

from provisionerd.orphans.classify import Classification, ClassifierMemory, Observation, OrphanPolicy, classify
from provisionerd.planner.fact_view import FactView, MachineRecord

#: Listed plus known machines from which a pass classifies in a worker thread (see ``classify_off_loop``).
OFF_LOOP_AT = 5000


#: Records copied per loop step by ``view_snapshot``: 1-6 ms (a copy touches each record to count a reference, and
#: at 100k records those are cache misses: the whole dict in one step took 12-22 ms, a step of 20,000 up to 13 ms).
SNAPSHOT_CHUNK = 10_000
#: Copies begun again because a fact was folded between two of their steps, before one is taken in a single step.
SNAPSHOT_TRIES = 3


async def view_snapshot(view: FactView, *, chunk: int = SNAPSHOT_CHUNK) -> FactView:
    """A copy of what the classifier reads of ``view`` (its intents, machines, returns and reported orphans), so a
    thread can classify while the session folds new facts into the live view. The records are shared: folding
    replaces or updates them field by field, never leaving one half-written for a reader.

    The machines are copied ``chunk`` at a time, one loop step each. Every change to the view's dicts is a folded
    fact, which moves ``last_index``: a copy that sees it move between two steps is begun again (the new facts are
    in the next one); after ``SNAPSHOT_TRIES`` such copies (facts arriving faster than a copy takes) it is taken in
    one step. The rest (intents, returns, reports: one per op, not per machine) is copied in the copy's last step,
    so the snapshot is the view of one moment. The copy starts in a step of its own: the step that called it may
    have done a good part of one already (the end of a listing: its cleared ids resolved, the controller's view
    read; a first chunk after them made a step of 13 ms)."""
    await trio.lowlevel.checkpoint()
    for _ in range(SNAPSHOT_TRIES):
        machines = await _copied(view, chunk)
        if machines is not None:
            return _snapshot(view, machines)
    return _snapshot(view, dict(view.machines))


async def _copied(view: FactView, chunk: int) -> dict[str, MachineRecord] | None:
    """``view.machines`` copied ``chunk`` entries a step; ``None`` once a fact was folded meanwhile."""
    mark = view.last_index
    copy: dict[str, MachineRecord] = {}
    entries = iter(view.machines.items())
    while True:
        before = len(copy)
        copy.update(itertools.islice(entries, chunk))
        if len(copy) - before < chunk:
            return copy
        await trio.lowlevel.checkpoint()
        if view.last_index != mark:
            return None


def _snapshot(view: FactView, machines: dict[str, MachineRecord]) -> FactView:
    return FactView(
        intents=dict(view.intents),
        machines=machines,
        returns=dict(view.returns),
        reported_orphans=dict(view.reported_orphans),
        latest_epoch=dict(view.latest_epoch),
        last_index=view.last_index,
    )


#: Passes holding the collector paused now, and whether it was enabled before the first of them (process-wide, as
#: the collector is: passes of several providers may overlap).
_pausing = {"count": 0, "was_enabled": True}


@contextlib.contextmanager
def collector_paused(large: bool) -> Iterator[None]:
    """Pause the cyclic collector inside the block when ``large`` (see the module docstring); nested and overlapping
    blocks resume it when the last one ends, and only if it ran before the first. Reference counting still frees
    everything that is not in a cycle; cycles made meanwhile wait for the next collection after the pass."""
    if not large:
        yield
        return
    if _pausing["count"] == 0:
        _pausing["was_enabled"] = gc.isenabled()
        gc.disable()
    _pausing["count"] += 1
    try:
        yield
    finally:
        _pausing["count"] -= 1
        if _pausing["count"] == 0 and _pausing["was_enabled"]:
            gc.enable()


def is_large(obs: Observation) -> bool:
    """Whether a pass is large enough (``OFF_LOOP_AT``) to classify and release off the loop."""
    listed = len(obs.listing) if isinstance(obs.listing, tuple) else 0
    known = len(obs.view.machines) if isinstance(obs.view, FactView) else 0
    return listed + known >= OFF_LOOP_AT


async def release_off_loop(held: list[Any]) -> None:
    """Drop what ``held`` holds (its only references) in a worker thread: freeing 100k listed machines at once is
    ~30-50 ms of deallocation, which the thread does in the GIL's switch-interval slices instead of in one loop
    step."""
    await trio.to_thread.run_sync(held.clear)


async def classify_off_loop(obs: Observation, policy: OrphanPolicy, memory: ClassifierMemory) -> Classification:
    """``classify``, in a worker thread when the pass is large (``OFF_LOOP_AT`` listed plus known machines).

    Why: classifying a listing of 100k machines against a 100k-machine view is ~0.5 s of pure Python, which on
    the loop would stall heartbeats and lease renewals; in a thread the interpreter hands the loop the GIL every
    switch interval (5 ms). The thread classifies a snapshot of the view (``view_snapshot``), never the live one
    the session keeps folding into. The result is the same as inline (pure function, same inputs); small passes
    (every test on trio's ``MockClock``, the simulation) stay inline and deterministic."""
    if not is_large(obs):
        return classify(obs, policy, memory)
    if isinstance(obs.view, FactView):
        obs = attrs.evolve(obs, view=await view_snapshot(obs.view))
    return await trio.to_thread.run_sync(classify, obs, policy, memory)
