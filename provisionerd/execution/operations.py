"""The reconcile loop's one owner of operations: it starts each planned action, hands the open ops no task runs to
recovery, and keeps what their outcomes mean (issue 31 item 1: one owner per operation; it replaces the dispatcher,
the recovery pass and the outcome log, three parts that each kept their own piece of an op).

Every op's record is the executor's ``OpBook`` (``op_book``): claimed here when an action is planned (its task may
start after the next cycle has planned, and that cycle must not plan a second action on the same op or machines),
handed to the executor's call, released when the call ends; its idle clock and a failing return's back-off live in
the same record.

**Dispatch.** Each action started gets its op's record, which keeps the action and when it was planned: the one
record of what is in flight (``in_flight``, read by every plan: the planner keeps none). An action whose op_id or
machines are running is not started, so it is not in flight and the next plan plans its work again (``dispatch``
returns those op_ids). At most ``max_concurrent`` actions and recoveries run at once. Requests and returns go to the
executor (one whose provider turned unhealthy while it waited for its turn is dropped before the executor sees it:
no token, no intent); ``FailRequest``, ``MarkLost`` and ``DrainMachines`` are facts committed here
(``RequestFailed`` after the op's listing has been attributed, ``Lost``, ``DrainRequested``). A fact the gate
refuses drops the action (``ActionDropped``: no longer in flight), and a refusal that means the controller takes no
intents for now also backs the planner off (``observations.gate_refusal_observation``). Every planner observation
goes to the loop on the feedback channel (``execution.feedback``), through the op's record.

**Recovery.** An op open in the facts and idle (its provider leased and not unhealthy, no task running it, and for a
request not run by this process to a known end) is handed to ``Executor.recover_request`` / ``resume_return`` once
idle for ``recover_after`` seconds; at once in the first cycle its provider may be acted on after a lease grant (the
lease just held and the view resynced: a restart, or a lease taken over), because no task of this process started
it, so waiting tells nothing; and at once, too, for a request of this process whose run ended with a fact it could
not commit (``OpRecord.resume_soon``: its machines run with no fact until then). A return is resumed only while
some of its machines are still ``RETURNING``, not while its provider is throttled, and not before the back-off of
its last failure has passed. Each idle op is handed over once per ``recover_after``, whatever the outcome.

**Outcomes.** The last ``RECENT`` outcomes are kept (``recent``: tests and status). A request run to a known end
(``SETTLED_REQUESTS``) is settled in its record: its open intent is then the planner's (provisioning timeout). A
return that fails backs off exponentially (``recover_after`` doubling to ``return_retry_max``), and from the
``return_stuck_after``-th failure in a row raises a ``return_stuck`` event. Every outcome wakes the loop
(``wait_changed``): an outcome always changes what the planner should do next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from provisionerd.controller.view import ControllerView
from provisionerd.domain.actions import Action, DrainMachines, FailRequest, MarkLost, RequestMachines, ReturnMachines
from provisionerd.domain.model import NO_EPOCH, DrainRequested, Fact, Lost, RequestFailed, RequestIntent, ReturnIntent
from provisionerd.execution.executor import GATE_ERRORS, Executor
from provisionerd.execution.loop_inputs import LoopSettings
from provisionerd.execution.observations import gate_refusal_observation
from provisionerd.execution.op_book import OpRecord
from provisionerd.execution.values import ReturnOutcome
from provisionerd.planner.capacity import CapacityState
from provisionerd.planner.fact_view import MachineState
from provisionerd.planner.in_flight import InFlight
from provisionerd.planner.state import ActionDropped
from provisionerd.telemetry.events import EventLog

log = logging.getLogger(__name__)

#: Request outcomes after which the op is the planner's business, not recovery's.
SETTLED_REQUESTS = ("fulfilled", "partial", "rejected", "timed_out")
#: Return outcomes that leave machines RETURNING for recovery to retry (``dropped`` is the planner's business).
RETURN_FAILURES = ("partial", "rejected", "unknown")
#: How many outcomes ``recent`` keeps.
RECENT = 1000
#: Listings of an op before it is failed: tries, and the first pause between them (doubling).
ATTRIBUTE_TRIES = 3
ATTRIBUTE_RETRY = 1.0
#: How long a fail may wait for a listing of its op before it goes ahead anyway (the orphan pass is then the net).
DEFER_MAX = 600.0


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


#: The record kind of each action type (``OpRecord.kind``).
KINDS: dict[type, str] = {
    RequestMachines: "request",
    ReturnMachines: "return",
    MarkLost: "lost",
    FailRequest: "fail",
    DrainMachines: "drain",
}


def kind_of(action: Action) -> str:
    return KINDS.get(type(action), type(action).__name__)


class Operations:
    """``wall``: the planner's clock (observations and throttles are stamped with it)."""

    def __init__(
        self, executor: Executor, events: EventLog, settings: LoopSettings, *, wall: Callable[[], float]
    ) -> None:
        self._executor = executor
        self._book = executor.ops
        self._events = events
        self._settings = settings
        self._wall = wall
        self._limiter = trio.CapacityLimiter(settings.max_concurrent)
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        #: The planner's capacity state as of the last cycle (which providers refuse requests or returns now).
        self._capacity = CapacityState()
        self._view: ControllerView | None = None
        self._allowed: set[str] = set()  # the providers allowed in the previous recovery pass (new: just granted)
        #: The last ``RECENT`` outcomes, for tests and status.
        self.recent: list[Any] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the ops' tasks run in (started by the loop, cancelled with it)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def wait_changed(self) -> None:
        """Return at the next outcome recorded."""
        await self._changed.wait()

    def _record(self, outcome: Any) -> None:
        if isinstance(outcome, ReturnOutcome):
            self._note_return(outcome)
        self.recent.append(outcome)
        del self.recent[:-RECENT]
        self._changed.set()
        self._changed = trio.Event()

    def _spawn(self, fn: Any, *args: object) -> None:
        assert self._nursery is not None, "Operations.run is not running"
        self._nursery.start_soon(fn, *args)

    # --- dispatch -----------------------------------------------------------------------------------------------

    def dispatch(
        self,
        actions: tuple[Action, ...],
        allowed: set[str],
        offered: set[str],
        view: ControllerView,
        capacity: CapacityState,
        planned_at: float,
    ) -> list[str]:
        """Start each action whose provider may be acted on (``offered`` for a request: fresh offers; ``allowed``
        otherwise) and whose op and machines are free; its record keeps it as in flight, planned at
        ``planned_at`` (the plan's ``now``). The op_ids not started: not in flight, so the next plan may plan their
        work again."""
        self._view, self._capacity = view, capacity
        handed_back = []
        for action in actions:
            may = offered if isinstance(action, RequestMachines) else allowed
            record = (
                self._book.claim(action.op_id, kind_of(action), action.provider, machines_of(action))
                if action.provider in may
                else None
            )
            if record is None:
                handed_back.append(action.op_id)
                continue
            self._book.plan(record, action, planned_at)
            self._events.emit(
                "action", phase="planned", op_id=action.op_id, provider=action.provider, **action_fields(action)
            )
            self._spawn(self._execute, action, record)
        return handed_back

    def in_flight(self) -> InFlight:
        """The actions the planner planned that are under way (the op book's), for the next plan."""
        return self._book.in_flight()

    async def _execute(self, action: Action, record: OpRecord) -> None:
        # The loop outlives any single action: a bug in one (an exception no flow expects) is logged, reported and
        # dropped (the planner plans it again), never allowed to take the daemon down.
        try:
            await self._execute_one(action, record)
        except Exception as exc:  # noqa: BLE001 - the boundary of one action
            log.exception("action %s failed unexpectedly", action.op_id)
            self._events.emit(
                "action", phase="crashed", op_id=action.op_id, provider=action.provider, error=type(exc).__name__
            )
            record.add(ActionDropped(action.op_id))
        finally:
            self._book.release(record)

    async def _execute_one(self, action: Action, record: OpRecord) -> None:
        ex = self._executor
        async with self._limiter:
            returning = isinstance(action, ReturnMachines)
            if (returning or isinstance(action, RequestMachines)) and self._capacity.refuses(
                action.provider, returning=returning
            ):
                # Planned before the provider turned unhealthy (an action queued behind the limiter while an
                # earlier one failed): no token is minted and no intent committed for it.
                self._events.emit(
                    "action", phase="dropped", op_id=action.op_id, provider=action.provider, reason="provider_unhealthy"
                )
                record.add(ActionDropped(action.op_id))
                return
            outcome: Any
            match action:
                case RequestMachines():
                    outcome = await ex.request(action, record=record)
                    if outcome.status in SETTLED_REQUESTS:
                        self._book.settle(record)
                    record.resume_soon = outcome.status == "unknown" and outcome.code == "commit_failed"
                case ReturnMachines():
                    outcome = await ex.return_machines(
                        action.provider, action.op_id, action.machine_ids, action.reason, record=record
                    )
                case FailRequest():
                    fact: Fact = RequestFailed(action.provider, NO_EPOCH, action.op_id, action.reason)
                    if await self._attribute(record, action.op_id):
                        outcome = await self._commit(record, action, fact)
                    else:  # the planner fails it again on a later cycle, after a listing has explained the op
                        record.add(ActionDropped(action.op_id))
                        outcome = f"deferred RequestFailed {action.op_id}: its listing failed"
                case MarkLost():
                    fact = Lost(action.provider, NO_EPOCH, action.op_id, action.machine_id, action.reason)
                    outcome = await self._commit(record, action, fact)
                case DrainMachines():
                    fact = DrainRequested(
                        action.provider, NO_EPOCH, action.op_id, action.machine_ids, action.reason, action.at
                    )
                    outcome = await self._commit(record, action, fact)
        self._record(outcome)

    async def _attribute(self, record: OpRecord, op_id: str) -> bool:
        """Before an op is failed, commit the instance facts of the machines its listing shows (seed 5406: a hung
        requestMachines made 7 machines after the deadline; failed unlisted, they were never attributed and never
        returned). The listing is tried ``ATTRIBUTE_TRIES`` times, ``ATTRIBUTE_RETRY`` seconds apart and doubling;
        whether the op is explained (False: the fail waits, so that no machine of a failed op runs with no fact)."""
        view = self._view
        intent = view.facts.intents.get(op_id) if view is not None else None
        if intent is None or not self._executor.serves(intent.intent.provider):
            return True  # nothing to list: no intent in the view, or a provider this daemon does not serve
        client = self._executor.client(intent.intent.provider)
        # A legacy op with a lost call: what its answered calls made is listed (retried like any listing: a plugin
        # that crashes while reading its requests is no reason to fail the op unlisted, seed 741613929); what the
        # lost call made can never be listed, and the orphan report names it.
        unlistable = client.legacy and op_id in {u.op_id for u in client.unknown_outcomes()}
        if record.deferred_since is not None and trio.current_time() - record.deferred_since >= DEFER_MAX:
            self._events.emit(
                "action", phase="deferred", op_id=op_id, provider=intent.intent.provider, kind="fail", reason="gave_up"
            )
            return True  # no listing for DEFER_MAX: the fail goes ahead, the orphan pass is the net
        delay = ATTRIBUTE_RETRY
        for attempt in range(ATTRIBUTE_TRIES):
            if await self._executor.attribute_op(intent.intent, unlistable_as_empty=unlistable) is not None:
                return True
            if attempt + 1 < ATTRIBUTE_TRIES:
                await trio.sleep(delay)
                delay *= 2
        if record.deferred_since is None:
            record.deferred_since = trio.current_time()
        self._events.emit(
            "action", phase="deferred", op_id=op_id, provider=intent.intent.provider, kind="fail", reason="list_failed"
        )
        return False

    async def _commit(self, record: OpRecord, action: Action, fact: Fact) -> str:
        try:
            await self._executor.commit_fact(fact)
            return f"committed {type(fact).__name__} {action.op_id}"
        except GATE_ERRORS as exc:
            record.add(ActionDropped(action.op_id))
            refused = gate_refusal_observation(action.provider, exc, self._wall())
            if refused is not None:
                record.add(refused)
            return f"dropped {type(fact).__name__} {action.op_id}: {exc}"

    # --- recovery -----------------------------------------------------------------------------------------------

    def forget_idle(self) -> None:
        """Start every idle clock over (a new view: what was idle in the old one says nothing)."""
        self._book.forget_idle()

    def recover(self, view: ControllerView, allowed: set[str], capacity: CapacityState) -> None:
        """Hand open intents/returns nobody runs to the executor once idle for ``recover_after`` seconds."""
        now, book, facts = trio.current_time(), self._book, view.facts
        self._view, self._capacity = view, capacity
        # An unhealthy provider is asked nothing but its probe: its ops wait until it is healthy again (a quota
        # exceeded still lists and returns: neither needs quota).
        allowed = {p for p in allowed if not capacity.refuses(p, returning=True)}
        idle: dict[str, RequestIntent | ReturnIntent] = {}
        for op_id in facts.open_ops:
            intent = facts.intents[op_id].intent
            if intent.provider in allowed and not book.is_running(op_id) and not book.settled(op_id):
                idle[op_id] = intent
        for op_id in facts.open_returns:  # the pending returns only, never every return ever made
            ret = facts.returns[op_id].intent
            if ret.provider not in allowed or book.is_running(op_id):
                continue
            live = [
                m for m in ret.machine_ids if m in facts.machines and facts.machines[m].state is MachineState.RETURNING
            ]
            if live and capacity.throttled(ret.provider, self._wall()) is None:
                idle[op_id] = ret
        book.keep(set(facts.open_ops) | set(facts.open_returns))
        # Ops idle in the first cycle after their provider's grant: none of ours, recovered at once (docstring).
        granted = allowed - self._allowed
        self._allowed = set(allowed)
        book.stop_idle_clocks(keep=idle)  # an op not idle now starts its clock over when it is again
        for op_id, open_op in idle.items():
            returning = isinstance(open_op, ReturnIntent)
            kind, provider = ("return" if returning else "request"), open_op.provider
            record = book.idle_clock(op_id, kind, provider, -float("inf") if provider in granted else now)
            since = now if record.idle_since is None else record.idle_since
            if now - since < self._settings.recover_after and not record.resume_soon:
                continue
            if record.retry_at is not None and now < record.retry_at:
                continue  # a return backing off after a failure
            claimed = book.claim(
                op_id, kind, provider, open_op.machine_ids if isinstance(open_op, ReturnIntent) else ()
            )
            if claimed is not None:
                claimed.resume_soon = False
                self._spawn(self._run_recovery, open_op, claimed)

    async def _run_recovery(self, intent: RequestIntent | ReturnIntent, record: OpRecord) -> None:
        outcome: Any
        try:
            async with self._limiter:
                if isinstance(intent, RequestIntent):
                    outcome = await self._executor.recover_request(intent, record=record)
                else:
                    outcome = await self._executor.resume_return(intent, record=record)
        finally:
            self._book.release(record)
            # Once per recover_after, whatever the outcome: the idle clock starts again when the call ends.
            record.idle_since = trio.current_time()
        self._record(outcome)

    # --- failing returns ----------------------------------------------------------------------------------------

    def _note_return(self, outcome: ReturnOutcome) -> None:
        """Back off a return that failed (exponentially, capped) and say so once it keeps failing."""
        s = self._settings
        failures = self._book.note_return(
            outcome.op_id,
            outcome.status in RETURN_FAILURES,
            lambda n: min(s.return_retry_max, s.recover_after * 2 ** min(n - 1, 32)),
        )
        if failures >= s.return_stuck_after:
            record = self._book.get(outcome.op_id)
            retry_in = 0.0 if record is None or record.retry_at is None else record.retry_at - trio.current_time()
            self._events.emit(
                "return_stuck",
                op_id=outcome.op_id,
                provider=outcome.provider,
                failures=failures,
                status=outcome.status,
                code=outcome.code,
                detail=outcome.detail[:200],
                retry_in=round(retry_in, 3),
            )

    def failing_returns(self) -> dict[str, int]:
        """Each failing return's op_id and its failures in a row."""
        return self._book.failing_returns()
