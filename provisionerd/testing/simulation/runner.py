"""Run one seed: one ``trio.run`` on ``MockClock(autojump_threshold=0)`` with trio's scheduler made deterministic.

trio shuffles the order in which runnable tasks step (to keep code from depending on it). For a run to repeat from
its seed alone that order must come from the seed too: while a run is in progress, trio's scheduler uses its
deterministic mode (the one its Hypothesis integration turns on: each batch is sorted by task creation order, then
shuffled by trio's own RNG) and that RNG is seeded from the world. So the seed also chooses the interleavings, and
different seeds explore different ones. Both are restored afterwards.

A busy loop would keep the mock clock from ever jumping, so the run could never end: a scheduler instrument
checks the wall clock every few thousand scheduler passes and cancels the run past ``wall_budget`` seconds
(reported as the ``stuck`` invariant).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import attrs
import trio
import trio.testing
from trio._core import _run as trio_run_internals

from provisionerd.testing.simulation.observe import Violation
from provisionerd.testing.simulation.world import World


@attrs.frozen
class SimResult:
    seed: int
    violations: tuple[Violation, ...]
    virtual_seconds: float
    wall_seconds: float
    digest: str
    faults: tuple[str, ...]
    counts: dict[str, int] = attrs.field(eq=False, repr=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def first(self) -> Violation | None:
        return min(self.violations, key=lambda v: v.at) if self.violations else None


@contextlib.contextmanager
def deterministic_scheduling(seed: int) -> Iterator[None]:
    """trio's scheduler in its deterministic mode, its RNG seeded; both restored on exit."""
    internals: Any = trio_run_internals
    saved_flag, saved_state = internals._ALLOW_DETERMINISTIC_SCHEDULING, internals._r.getstate()
    internals._ALLOW_DETERMINISTIC_SCHEDULING = True
    internals._r.seed(seed)
    try:
        yield
    finally:
        internals._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag
        internals._r.setstate(saved_state)


@contextlib.contextmanager
def seeded_tokens(source: Any) -> Iterator[None]:
    """The lifecycle's join tokens drawn from ``source()`` instead of ``secrets`` while a run is in progress."""
    try:
        from provisionerd.domain import tokens
    except ImportError:  # no lifecycle in this tree
        yield
        return
    saved = tokens.new_token
    tokens.new_token = source
    try:
        yield
    finally:
        tokens.new_token = saved


class _WallBudget(trio.abc.Instrument):
    """Cancels ``scope`` when the run has used ``budget`` wall seconds (checked every ``every`` passes)."""

    def __init__(self, scope: trio.CancelScope, budget: float, every: int = 2000) -> None:
        self.scope = scope
        self.deadline = time.perf_counter() + budget
        self.every = every
        self.passes = 0
        self.tripped = False

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1
        if self.passes % self.every == 0 and time.perf_counter() > self.deadline and not self.tripped:
            self.tripped = True
            self.scope.cancel()


def run_world(world: World, *, wall_budget: float = 60.0) -> SimResult:
    """Run ``world`` to its end (or until the wall budget is used) and return what it saw."""
    started = time.perf_counter()
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> float:
        with trio.CancelScope() as scope:
            budget = _WallBudget(scope, wall_budget)
            trio.lowlevel.add_instrument(budget)
            await world.run()
        if budget.tripped:
            world.recorder.violate(
                "stuck", f"no end after {wall_budget:g}s of wall time, at virtual {trio.current_time():.3f}s"
            )
        return trio.current_time()

    with deterministic_scheduling(world.scheduler_seed), seeded_tokens(world.new_token):
        virtual = trio.run(main, clock=clock)
    rec = world.recorder
    return SimResult(
        seed=world.seed,
        violations=tuple(rec.violations),
        virtual_seconds=virtual,
        wall_seconds=time.perf_counter() - started,
        digest=rec.digest,
        faults=tuple(f"{f.kind}@{f.at:g}" for f in world.plan.faults),
        counts=dict(rec.counts),
    )


def run_seed(seed: int, *, keep_trace: bool = False, wall_budget: float = 60.0, **overrides: Any) -> SimResult:
    """One seed, one run. ``overrides`` replace drawn ``WorldSettings`` fields (e.g. ``horizon=300``)."""
    return run_world(World(seed, keep_trace=keep_trace, **overrides), wall_budget=wall_budget)
