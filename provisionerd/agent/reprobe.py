"""Health after join: the agent measures its machine again every ``interval`` seconds (``--reprobe-interval``).

A machine that passed its probes at the join can fail them later (a GPU whose driver falls over, a disk that goes
read-only). :class:`Reprobe` runs the same measure the join's report came from (``agent.capabilities.report``: the
same ``--probe`` commands, bounded the same way, a probe that hangs reporting ``!timeout``; with ``--report-host``
the built-in entries too) on trio's clock, every ``interval`` seconds give or take ``jitter`` of it, so a fleet
started at once does not probe at once. The measure blocks (it waits for child processes), so it runs in a worker
thread, abandoned on cancellation (a probe kills its own process group at its timeout either way).

When a report differs from the last one handed over (at first the join's own), ``report(capabilities, probed_at)``
gets the whole report and the wall-clock time it was made (epoch seconds): the agent's
:meth:`~provisionerd.agent.worker.WorkerAgent.report_capabilities`, which sends it once in its next
``WorkerStatus`` (protocol §6.4 "Health after join"). An unchanged report is not handed over again. The trio clock
schedules; the wall clock only stamps.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping

import trio

from provisionerd.telemetry.logging_setup import event_extra

log = logging.getLogger(__name__)

#: ``--reprobe-interval``'s default (seconds); 0 turns re-probing off.
DEFAULT_INTERVAL = 300.0
#: How far one interval may stray, as a fraction of it.
DEFAULT_JITTER = 0.1

#: Measures the machine (blocking): ``functools.partial(capabilities.report, probes, timeout, host=...)``.
Measure = Callable[[], Mapping[str, str]]


class Reprobe:
    """Measures again every ``interval`` seconds and reports each change (see the module docstring).

    ``joined``: the report the join carried (the first one a re-probe is compared with). ``in_thread``: run the
    measure in a worker thread (tests of exact times run an instant fake inline). ``wall``: epoch seconds, for
    ``probed_at``."""

    def __init__(
        self,
        measure: Measure,
        report: Callable[[Mapping[str, str], float], None],
        interval: float = DEFAULT_INTERVAL,
        *,
        joined: Mapping[str, str],
        jitter: float = DEFAULT_JITTER,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        in_thread: bool = True,
    ):
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter is a fraction of the interval in [0, 1), not {jitter!r}")
        self._measure = measure
        self._report = report
        self._interval = interval
        self._jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._wall = wall
        self._in_thread = in_thread
        #: The last report handed over (the join's until a re-probe differs), and how many were handed over.
        self.last: dict[str, str] = dict(joined)
        self.changes = 0
        self.probes = 0

    def next_delay(self) -> float:
        """Seconds until the next measure: ``interval`` give or take ``jitter`` of it."""
        return self._interval * (1 + self._rng.uniform(-self._jitter, self._jitter))

    async def run(self) -> None:
        """Measure every interval until cancelled (the first measure one interval after the start)."""
        while True:
            await trio.sleep(self.next_delay())
            await self.probe()

    async def probe(self) -> None:
        """One measure; hands the report over when it changed."""
        if self._in_thread:
            found = await trio.to_thread.run_sync(self._measure, abandon_on_cancel=True)
        else:
            found = self._measure()
        self.probes += 1
        found = dict(found)
        if found == self.last:
            return
        probed_at = self._wall()
        changed = sorted(k for k in found.keys() | self.last.keys() if found.get(k) != self.last.get(k))
        log.warning(
            "re-probe changed %s",
            " ".join(f"{k}={self.last.get(k, '')!r}->{found.get(k, '')!r}" for k in changed),
            extra=event_extra("reprobe_changed", {"capabilities": found, "probed_at": probed_at}),
        )
        self.last = found
        self.changes += 1
        self._report(dict(found), probed_at)
