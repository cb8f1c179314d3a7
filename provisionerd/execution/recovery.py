"""The reconcile loop's recovery: open intents and returns that no task of this process is running (a restart, a
commit whose ack was lost, an unknown outcome) are handed to ``Executor.recover_request`` / ``resume_return``.

When: an op found open and idle in the first cycle its provider may be acted on after a lease grant (the lease
just held, the view resynced since the grant: a restart, or a lease taken over from another holder) was started by
no task of this process, so waiting tells nothing: it is handed over **at once** (one listing settles an open
request, ``request_flow`` "After a restart"). Any other idle op (an unknown outcome of this process's own, an ack
lost) is handed over once it has been seen idle for ``recover_after`` seconds.

An op is idle when its provider is leased and not unhealthy, the executor runs nothing on it, and (for a request)
this process did not run it to a known end (``OutcomeLog.settled``: the planner's provisioning timeout owns those).
A return is resumed only while some of its machines are still ``RETURNING``, not while its provider is throttled,
and not before the back-off of its last failure has passed (``OutcomeLog.return_retry_at``). Each idle op is handed
over once per ``recover_after``, whatever the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from provisionerd.controller.view import ControllerView
from provisionerd.domain.model import RequestIntent, ReturnIntent
from provisionerd.execution.executor import Executor
from provisionerd.execution.loop_inputs import LoopSettings, Spawn
from provisionerd.execution.outcome_log import OutcomeLog
from provisionerd.execution.values import RequestOutcome, ReturnOutcome
from provisionerd.planner.fact_view import MachineState
from provisionerd.planner.state import PlannerState


class Recovery:
    """``state`` is the planner state now (its throttles hold returns back); ``wall`` the planner's clock."""

    def __init__(
        self,
        executor: Executor,
        outcomes: OutcomeLog,
        limiter: trio.CapacityLimiter,
        spawn: Spawn,
        settings: LoopSettings,
        *,
        state: Callable[[], PlannerState],
        wall: Callable[[], float],
    ) -> None:
        self._executor = executor
        self._outcomes = outcomes
        self._limiter = limiter
        self._spawn = spawn
        self._settings = settings
        self._state = state
        self._wall = wall
        self._idle_since: dict[str, float] = {}  # open intent/return op -> first seen with no task (trio clock)
        self._allowed: set[str] = set()  # the providers allowed in the previous call (a new one: just granted)

    def forget_idle(self) -> None:
        """Start every idle clock over (a new view: what was idle in the old one says nothing)."""
        self._idle_since.clear()

    def recover(self, view: ControllerView, allowed: set[str]) -> None:
        """Hand open intents/returns nobody runs to the executor once idle for ``recover_after`` seconds."""
        now = trio.current_time()
        ex, facts, outcomes = self._executor, view.facts, self._outcomes
        outcomes.keep_settled(facts.open_ops)
        idle: dict[str, Any] = {}
        capacity = self._state().capacity
        # An unhealthy provider is asked nothing but its probe: its ops wait until it is healthy again (a quota
        # exceeded still lists and returns: neither needs quota).
        allowed = {p for p in allowed if not capacity.refuses(p, returning=True)}
        for op_id in facts.open_ops:
            intent = facts.intents[op_id].intent
            if intent.provider in allowed and not ex.is_busy(op_id) and not outcomes.settled(op_id):
                idle[op_id] = intent
        outcomes.keep_returns(set(facts.open_returns))
        for op_id in facts.open_returns:  # the pending returns only, never every return ever made
            record = facts.returns[op_id]
            if record.intent.provider not in allowed or ex.is_busy(op_id):
                continue
            live = [
                m
                for m in record.intent.machine_ids
                if m in facts.machines and facts.machines[m].state is MachineState.RETURNING
            ]
            if live and capacity.throttled(record.intent.provider, self._wall()) is None:
                idle[op_id] = record.intent
        # Ops idle in the first cycle after their provider's grant: none of ours, recovered at once (docstring).
        granted = allowed - self._allowed
        self._allowed = set(allowed)
        inherited = -float("inf")
        self._idle_since = {
            op: self._idle_since.get(op, inherited if intent.provider in granted else now)
            for op, intent in idle.items()
        }
        for op_id, intent in idle.items():
            if now - self._idle_since[op_id] < self._settings.recover_after:
                continue
            retry_at = outcomes.return_retry_at(op_id)
            if retry_at is not None and now < retry_at:
                continue  # a return backing off after a failure
            self._idle_since[op_id] = now  # once per recover_after, whatever the outcome
            self._spawn(self._run_recovery, intent)

    async def _run_recovery(self, intent: RequestIntent | ReturnIntent) -> None:
        outcome: RequestOutcome | ReturnOutcome
        async with self._limiter:
            if isinstance(intent, RequestIntent):
                outcome = await self._executor.recover_request(intent)
            else:
                outcome = await self._executor.resume_return(intent)
        self._outcomes.record(outcome)
