"""The reconcile loop's dispatch: run each planned action in the loop's nursery and record its outcome.

An action whose op_id or machines are still busy in the executor is handed back to the planner (``ActionDropped``)
and replanned later: never two actions on one machine. A dispatched action is claimed in the executor at once
(``Executor.claim``), because its task may start after the next cycle has planned; that one claim is handed to the
executor's call and released when the action ends. At most ``max_concurrent`` actions (and recoveries) run at once
(the loop's ``CapacityLimiter``).

Requests and returns go to the executor (one whose provider turned unhealthy while it waited for the limiter is
dropped before the executor sees it: no token, no intent); ``FailRequest``, ``MarkLost`` and ``DrainMachines`` are
facts committed here (``RequestFailed`` after the op's listing has been attributed, ``Lost``, ``DrainRequested``). A
fact the gate refuses hands the action back, and a refusal that means the controller takes no intents for now also
backs the planner off (``observations.gate_refusal_observation``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from provisionerd.controller.view import ControllerView
from provisionerd.domain.actions import Action, DrainMachines, FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.domain.model import NO_EPOCH, DrainRequested, Fact, Lost, RequestFailed
from provisionerd.execution.claims import Claim
from provisionerd.execution.executor import GATE_ERRORS, Executor
from provisionerd.execution.loop_inputs import Spawn
from provisionerd.execution.observations import gate_refusal_observation
from provisionerd.execution.outcome_log import OutcomeLog
from provisionerd.planner.state import ActionDropped, Observation
from provisionerd.telemetry.events import EventLog

log = logging.getLogger(__name__)

#: Request outcomes after which the op is the planner's business, not recovery's (``OutcomeLog.settle``).
SETTLED_REQUESTS = ("fulfilled", "partial", "rejected", "timed_out")


def action_fields(action: Action) -> dict[str, Any]:
    """The fields of a ``planned`` action event that say what the action is."""
    match action:
        case RequestMachines():
            return {
                "kind": "request",
                "template": action.template_id,
                "count": action.count,
                "demand_id": action.demand_id,
            }
        case ReturnMachines():
            return {"kind": "return", "machines": list(action.machine_ids), "reason": action.reason}
        case MarkLost():
            return {"kind": "lost", "machine": action.machine_id, "reason": action.reason}
        case FailRequest():
            return {"kind": "fail", "reason": action.reason}
        case DrainMachines():
            return {"kind": "drain", "machines": list(action.machine_ids), "reason": action.reason}
    return {"kind": type(action).__name__}


def machines_of(action: Action) -> tuple[str, ...]:
    """The machines ``action`` works on (claimed with its op_id)."""
    if isinstance(action, ReturnMachines):
        return action.machine_ids
    if isinstance(action, MarkLost):
        return (action.machine_id,)
    return ()


class Dispatcher:
    """``apply`` folds an observation into the planner state and wakes the loop; ``hand_back`` folds an
    ``ActionDropped`` without waking it (the cycle that planned the action is still running); ``view`` is the
    session's current view; ``wall`` the planner's clock; ``refuses(provider, returning)`` whether the provider is
    unhealthy for a request (a return) now."""

    def __init__(
        self,
        executor: Executor,
        events: EventLog,
        outcomes: OutcomeLog,
        limiter: trio.CapacityLimiter,
        spawn: Spawn,
        *,
        view: Callable[[], ControllerView | None],
        apply: Callable[[Observation], None],
        hand_back: Callable[[str], None],
        wall: Callable[[], float],
        refuses: Callable[[str, bool], bool] = lambda provider, returning: False,
    ) -> None:
        self._executor = executor
        self._events = events
        self._outcomes = outcomes
        self._limiter = limiter
        self._spawn = spawn
        self._view = view
        self._apply = apply
        self._hand_back = hand_back
        self._wall = wall
        self._refuses = refuses

    def dispatch(self, action: Action, allowed: set[str]) -> None:
        """Start ``action`` if its provider is leased and its op and machines are free; else hand it back."""
        # Claimed now: the task may start after the next cycle has planned. Held until the action ends.
        claim = self._executor.claim(action.op_id, machines_of(action)) if action.provider in allowed else None
        if claim is None:
            self._hand_back(action.op_id)
            return
        self._events.emit(
            "action", phase="planned", op_id=action.op_id, provider=action.provider, **action_fields(action)
        )
        self._spawn(self._execute, action, claim)

    async def _execute(self, action: Action, claim: Claim) -> None:
        # The loop outlives any single action: a bug in one (an exception no flow expects) is logged, reported
        # and handed back to the planner, never allowed to take the daemon down.
        try:
            await self._execute_one(action, claim)
        except Exception as exc:  # noqa: BLE001 - the boundary of one action
            log.exception("action %s failed unexpectedly", action.op_id)
            self._events.emit(
                "action", phase="crashed", op_id=action.op_id, provider=action.provider, error=type(exc).__name__
            )
            self._apply(ActionDropped(action.op_id))
        finally:
            self._executor.release(claim)

    async def _execute_one(self, action: Action, claim: Claim) -> None:
        ex = self._executor
        async with self._limiter:
            returning = isinstance(action, ReturnMachines)
            if (returning or isinstance(action, RequestMachines)) and self._refuses(action.provider, returning):
                # Planned before the provider turned unhealthy (an action queued behind the limiter while an
                # earlier one failed): no token is minted and no intent committed for it.
                self._events.emit(
                    "action", phase="dropped", op_id=action.op_id, provider=action.provider, reason="provider_unhealthy"
                )
                self._apply(ActionDropped(action.op_id))
                return
            outcome: Any
            match action:
                case RequestMachines():
                    outcome = await ex.request(action, claim=claim)
                    if outcome.status in SETTLED_REQUESTS:
                        self._outcomes.settle(action.op_id)
                case ReturnMachines():
                    outcome = await ex.return_machines(
                        action.provider, action.op_id, action.machine_ids, action.reason, claim=claim
                    )
                case FailRequest():
                    await self._attribute(action.op_id)
                    outcome = await self._commit(
                        action, RequestFailed(action.provider, NO_EPOCH, action.op_id, action.reason)
                    )
                case MarkLost():
                    outcome = await self._commit(
                        action, Lost(action.provider, NO_EPOCH, action.op_id, action.machine_id, action.reason)
                    )
                case DrainMachines():
                    fact = DrainRequested(
                        action.provider, NO_EPOCH, action.op_id, action.machine_ids, action.reason, action.at
                    )
                    outcome = await self._commit(action, fact)
        self._outcomes.record(outcome)

    async def _attribute(self, op_id: str) -> None:
        """Before an op is failed, record the machines its listing shows (seed 5406: a hung requestMachines made
        7 machines after the deadline; failed unlisted, they were never attributed and never returned). A listing
        that fails leaves the fail as it was: the orphan pass is the net for what stays unlisted."""
        view = self._view()
        record = view.facts.intents.get(op_id) if view is not None else None
        if record is not None:
            await self._executor.attribute_op(record.intent)

    async def _commit(self, action: Action, fact: Fact) -> str:
        try:
            await self._executor.commit_fact(fact)
            return f"committed {type(fact).__name__} {action.op_id}"
        except GATE_ERRORS as exc:
            self._apply(ActionDropped(action.op_id))
            refused = gate_refusal_observation(action.provider, exc, self._wall())
            if refused is not None:
                self._apply(refused)
            return f"dropped {type(fact).__name__} {action.op_id}: {exc}"
