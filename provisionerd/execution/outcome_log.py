"""What the reconcile loop keeps of the outcomes of the actions and recoveries it ran.

- the last 1000 outcomes (``recent``: for tests and status);
- the request ops this process ran to a known end (``settle``): their open intents are the planner's business
  (its provisioning timeout fails them), not recovery's;
- the returns that keep failing: each failure backs the return off exponentially (``recover_after`` doubling up to
  ``return_retry_max``) before recovery resumes it, and from the ``return_stuck_after``-th failure in a row on each
  one raises a ``return_stuck`` event. A return that succeeds, or is no longer open, is forgotten.

Every outcome recorded wakes the loop: an outcome always changes what the planner should do next.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import trio

from provisionerd.execution.loop_inputs import LoopSettings
from provisionerd.execution.values import ReturnOutcome
from provisionerd.telemetry.events import EventLog

#: Return outcomes that leave machines RETURNING for the loop to retry (``dropped`` is the planner's business).
RETURN_FAILURES = ("partial", "rejected", "unknown")

#: How many outcomes ``recent`` keeps.
RECENT = 1000


class OutcomeLog:
    def __init__(self, settings: LoopSettings, events: EventLog, wake: Callable[[], None]) -> None:
        self._settings = settings
        self._events = events
        self._wake = wake
        self.recent: list[Any] = []
        self._settled: set[str] = set()
        self._return_failures: dict[str, tuple[int, float]] = {}  # return op -> (failures in a row, retry not before)

    def record(self, outcome: Any) -> None:
        if isinstance(outcome, ReturnOutcome):
            self._note_return(outcome)
        self.recent.append(outcome)
        del self.recent[:-RECENT]
        self._wake()

    # --- requests run to a known end ----------------------------------------------------------------------------

    def settle(self, op_id: str) -> None:
        self._settled.add(op_id)

    def settled(self, op_id: str) -> bool:
        return op_id in self._settled

    def keep_settled(self, open_ops: Collection[str]) -> None:
        """Forget the settled ops no longer open (bounded: only ops still open matter)."""
        self._settled.intersection_update(open_ops)

    # --- failing returns ----------------------------------------------------------------------------------------

    def return_retry_at(self, op_id: str) -> float | None:
        """When a failing return may be resumed (trio clock; ``None``: it is not backing off)."""
        failing = self._return_failures.get(op_id)
        return None if failing is None else failing[1]

    def keep_returns(self, open_returns: Collection[str]) -> None:
        """Forget the failures of returns no longer open (bounded: only returns still open matter)."""
        for op_id in self._return_failures.keys() - set(open_returns):
            del self._return_failures[op_id]

    def failing_returns(self) -> dict[str, int]:
        """Each failing return's op_id and its failures in a row."""
        return {op_id: failures for op_id, (failures, _) in self._return_failures.items()}

    def _note_return(self, outcome: ReturnOutcome) -> None:
        """Back off a return that failed (exponentially, capped) and say so once it keeps failing."""
        if outcome.status not in RETURN_FAILURES:
            self._return_failures.pop(outcome.op_id, None)
            return
        failures = self._return_failures.get(outcome.op_id, (0, 0.0))[0] + 1
        s = self._settings
        delay = min(s.return_retry_max, s.recover_after * 2 ** min(failures - 1, 32))
        self._return_failures[outcome.op_id] = (failures, trio.current_time() + delay)
        if failures >= s.return_stuck_after:
            self._events.emit(
                "return_stuck",
                op_id=outcome.op_id,
                provider=outcome.provider,
                failures=failures,
                status=outcome.status,
                code=outcome.code,
                detail=outcome.detail[:200],
                retry_in=round(delay, 3),
            )
