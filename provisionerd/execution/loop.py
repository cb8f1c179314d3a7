"""The reconcile loop: plan from the controller's view and the offers, execute the actions, replan on every change.

One cycle (``cycle``) is synchronous: it reads the current ``ControllerView`` (complete: resynced *and* a demand
snapshot on this link), the leases and the offer feed, runs the pure planner, and starts each action in the loop's
nursery under a ``CapacityLimiter``. It plans nothing when

- the link is not up or the view is incomplete (after a rejoin, the loop's inputs are the new view's alone);
- no provider lease is valid (providers without one get no offers and their actions are dropped back to the
  planner, which plans them again once the lease is back; the gate would refuse them anyway);
- the offers of a leased provider could not be read recently (a cycle that could not read its inputs acts not).

An action whose op_id or machines are still busy in the executor is handed back (``ActionDropped``) and replanned
later: never two actions on one machine. Every outcome folds its observations into the planner state at once
(throttle back-off, offer unavailable, quota pause, reclaims) and wakes the loop.

Open intents and returns that no task of this process is running (a restart, a commit whose ack was lost, an
unknown outcome) are handed to ``Executor.recover_request`` / ``resume_return`` once they have been seen idle for
``recover_after`` seconds.

Replanning happens on every change of the session (demand, hosts, facts, link), of a lease, of the offers, after
every action's outcome, and every ``replan_interval`` seconds. ``getReturnRequests`` is polled every
``reclaim_interval`` with every live machine of each leased provider.

Clocks: the planner's ``now`` is ``wall()`` (wall-clock seconds, the clock of launch times and host ``since``);
everything the loop waits for runs on trio's clock. Tests pass ``wall=lambda: BASE + trio.current_time()``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.session import LinkState
from provisionerd.controller.view import ControllerView
from provisionerd.domain.actions import Action, FailRequest, MarkLost, Note, RequestMachines, ReturnMachines
from provisionerd.domain.errors import ControllerRejected, ProviderError, ProviderRejected
from provisionerd.domain.model import NO_EPOCH, Lost, RequestFailed
from provisionerd.execution.executor import GATE_ERRORS, Executor
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.execution.values import ReturnOutcome
from provisionerd.planner.capacity import Throttled
from provisionerd.planner.fact_view import MachineState
from provisionerd.planner.offers import Catalog
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import (
    BACKOFF_CODES,
    ActionDropped,
    IntentRefused,
    Observation,
    PlannerState,
    Reclaimed,
    SnapshotSeqReset,
    observe,
)
from provisionerd.telemetry.events import EventLog

log = logging.getLogger(__name__)


class ViewSource(Protocol):
    """What the loop needs of the controller session (``ControllerSession`` is one)."""

    view: ControllerView | None
    state: LinkState

    async def changed(self) -> None: ...


#: Return outcomes that leave machines RETURNING for the loop to retry (``dropped`` is the planner's business).
RETURN_FAILURES = ("partial", "rejected", "unknown")


@attrs.frozen
class LoopSettings:
    replan_interval: float = 10.0
    max_concurrent: int = 32
    reclaim_interval: float = 30.0
    recover_after: float = 30.0
    #: A return that keeps failing (the provider answers ``fail`` for its machines, refuses it, or never finishes) is
    #: retried after ``recover_after`` seconds, then twice as long each time up to ``return_retry_max``; from the
    #: ``return_stuck_after``-th failure in a row on, each failure raises a ``return_stuck`` event.
    return_retry_max: float = 1800.0
    return_stuck_after: int = 3


def _action_fields(action: Action) -> dict[str, Any]:
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
    return {"kind": type(action).__name__}


class ReconcileLoop:
    def __init__(
        self,
        session: ViewSource,
        leases: Mapping[str, LeaseKeeper],
        executor: Executor,
        feed: OfferFeed,
        policy: Policy,
        events: EventLog,
        *,
        settings: LoopSettings = LoopSettings(),
        wall: Callable[[], float] = time.time,
        incarnation: str | None = None,
        jitter_seed: int = 0,
        view_ready: Callable[[str], bool] | None = None,
    ) -> None:
        self.session = session
        self.leases = leases
        self.executor = executor
        self.feed = feed
        self.policy = policy
        self.events = events
        self.settings = settings
        self.wall = wall
        # Whether the view may be planned from for a provider (the daemon: resynced since its last lease grant).
        self.view_ready = view_ready if view_ready is not None else (lambda _provider: True)
        self.state = PlannerState.initial(incarnation or secrets.token_hex(4), jitter_seed)
        self.cycles = 0
        self.outcomes: list[Any] = []  # every outcome, for tests and status (bounded below)
        self._generation: int | None = None
        self._limiter = trio.CapacityLimiter(settings.max_concurrent)
        self._dirty = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._settled_ops: set[str] = set()  # ops this process ran to a known end (the planner takes over)
        self._idle_since: dict[str, float] = {}  # open intent/return op -> first seen with no task (trio clock)
        self._return_failures: dict[str, tuple[int, float]] = {}  # return op -> (failures in a row, retry not before)
        self._catalog_key: tuple[int, tuple[str, ...]] | None = None
        self._catalog = Catalog(())
        self._last_notes: set[tuple[str, str, str, str]] = set()
        self._skip = ""
        executor.observe = self.apply
        feed.on_failure = self._offers_failed

    # --- observations -------------------------------------------------------------------------------------------

    def apply(self, obs: Observation) -> None:
        """Fold one observation into the planner state and replan."""
        observed = observe(self.state, obs, self.policy)
        self.state = observed.state
        self._emit_notes(observed.notes, dedupe=False)
        self.wake()

    def _offers_failed(self, provider: str, error: ProviderError) -> None:
        """A ``getAvailableTemplates`` read failed: ``throttled`` backs the provider off like any other call."""
        if isinstance(error, ProviderRejected) and error.code == "throttled":
            self.apply(Throttled(provider, self.wall()))

    def wake(self) -> None:
        self._dirty.set()

    def _emit_notes(self, notes: tuple[Note, ...], *, dedupe: bool = True) -> None:
        keys = set()
        for note in notes:
            key = (note.kind, note.provider, note.demand_id, note.detail)
            keys.add(key)
            if not dedupe or key not in self._last_notes:
                self.events.emit(
                    "plan_note", kind=note.kind, provider=note.provider, demand_id=note.demand_id, detail=note.detail
                )
        if dedupe:
            self._last_notes = keys

    # --- the loop -----------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Started (waiting) before the first cycle: a change between that cycle and the wait is not lost.
            await nursery.start(self._watch, self.session.changed)
            await nursery.start(self._watch, self.feed.wait_changed)
            for keeper in self.leases.values():
                await nursery.start(self._watch, keeper.wait_changed)
            nursery.start_soon(self._reclaim_loop)
            task_status.started()
            while True:
                self._dirty = trio.Event()
                self.cycle()
                with trio.move_on_at(self._next_cycle_at()):
                    await self._dirty.wait()

    def _next_cycle_at(self) -> float:
        """The timer: ``replan_interval`` from now, or sooner when a back-off window (throttle, capacity,
        quota pause) ends, so the planner can use the provider or offer again at once."""
        now, wall_now = trio.current_time(), self.wall()
        capacity = self.state.capacity
        ends = [
            *(t.until for t in capacity.throttles.values()),
            *capacity.unavailable.values(),
            *(p.until for p in capacity.paused.values()),
            self.state.intent_backoff.until,
        ]
        upcoming = [end - wall_now for end in ends if end > wall_now]
        return now + min([self.settings.replan_interval, *upcoming])

    async def _watch(self, changed: Callable[[], Any], *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()  # no checkpoint until changed() is waiting
        while True:
            await changed()
            self.wake()

    def _skipped(self, why: str) -> None:
        if why and why != self._skip:
            self.events.emit("reconcile_skipped", reason=why)
        self._skip = why

    def leased(self) -> list[str]:
        """Providers whose lease is valid now and whose view is ready (a lease without a resync since its grant
        waits: until then the view may lack the facts the previous holder committed)."""
        now = trio.current_time()
        return [name for name, keeper in self.leases.items() if keeper.valid(now) and self.view_ready(name)]

    def _catalog_for(self, leased: list[str]) -> Catalog:
        key = (self.feed.version, tuple(leased))
        if key != self._catalog_key:
            allowed = set(leased)
            self._catalog = Catalog(p.offer for p in self.feed.catalog.by_key.values() if p.offer.provider in allowed)
            self._catalog_key = key
        return self._catalog

    def cycle(self) -> None:
        """One plan-and-dispatch pass (synchronous; actions run in the loop's nursery)."""
        view = self.session.view
        if view is None or self.session.state is not LinkState.UP or not view.complete:
            return self._skipped("controller view incomplete")
        if view.generation != self._generation:
            self._generation = view.generation
            self.state = observe(self.state, SnapshotSeqReset(), self.policy).state
            self._idle_since.clear()
        leased = self.leased()
        if not leased:
            return self._skipped("no provider lease")
        if self.state.intents_refused_until(self.wall()) is not None:  # the controller refused intents: wait
            return self._skipped("controller refused intents: backing off")
        if not self.feed.fresh(leased):
            return self._skipped("offers not read")
        self._skipped("")
        self.cycles += 1
        result = plan(
            self.state, view.demand, view.facts, self._catalog_for(leased), view.hosts, self.wall(), self.policy
        )
        self.state = result.state
        self._emit_notes(result.notes)
        allowed = set(leased)
        for action in result.actions:
            self._dispatch(action, allowed)
        self._recover(view, allowed)

    def _dispatch(self, action: Action, allowed: set[str]) -> None:
        ex = self.executor
        machines = (
            action.machine_ids
            if isinstance(action, ReturnMachines)
            else ((action.machine_id,) if isinstance(action, MarkLost) else ())
        )
        if action.provider not in allowed or action.op_id in ex.busy_ops or ex.busy_machines.intersection(machines):
            self.state = observe(self.state, ActionDropped(action.op_id), self.policy).state
            return
        self.events.emit(
            "action", phase="planned", op_id=action.op_id, provider=action.provider, **_action_fields(action)
        )
        # Reserve now: the task may start after the next cycle has planned.
        ex.busy_ops.add(action.op_id)
        ex.busy_machines.update(machines)
        assert self._nursery is not None
        self._nursery.start_soon(self._execute, action, machines)

    async def _execute(self, action: Action, machines: tuple[str, ...]) -> None:
        # The loop outlives any single action: a bug in one (an exception no flow expects) is logged, reported
        # and handed back to the planner, never allowed to take the daemon down.
        try:
            await self._execute_one(action, machines)
        except Exception as exc:  # noqa: BLE001 - the boundary of one action
            log.exception("action %s failed unexpectedly", action.op_id)
            self.events.emit(
                "action", phase="crashed", op_id=action.op_id, provider=action.provider, error=type(exc).__name__
            )
            self.executor.busy_ops.discard(action.op_id)
            self.executor.busy_machines.difference_update(machines)
            self.apply(ActionDropped(action.op_id))

    async def _execute_one(self, action: Action, machines: tuple[str, ...]) -> None:
        ex = self.executor
        async with self._limiter:
            ex.busy_ops.discard(action.op_id)
            ex.busy_machines.difference_update(machines)
            outcome: Any
            match action:
                case RequestMachines():
                    outcome = await ex.request(action)
                    if outcome.status in ("fulfilled", "partial", "rejected", "timed_out"):
                        self._settled_ops.add(action.op_id)
                case ReturnMachines():
                    outcome = await ex.return_machines(action.provider, action.op_id, action.machine_ids, action.reason)
                case FailRequest():
                    await self._attribute(action.op_id)
                    outcome = await self._commit(
                        action, RequestFailed(action.provider, NO_EPOCH, action.op_id, action.reason)
                    )
                case MarkLost():
                    outcome = await self._commit(
                        action, Lost(action.provider, NO_EPOCH, action.op_id, action.machine_id, action.reason)
                    )
        self._record(outcome)

    async def _attribute(self, op_id: str) -> None:
        """Before an op is failed, record the machines its listing shows (seed 5406: a hung requestMachines made
        7 machines after the deadline; failed unlisted, they were never attributed and never returned). A listing
        that fails leaves the fail as it was: the orphan pass is the net for what stays unlisted."""
        view = self.session.view
        record = view.facts.intents.get(op_id) if view is not None else None
        if record is not None:
            await self.executor.attribute_op(record.intent)

    async def _commit(self, action: Action, fact: Any) -> str:
        try:
            await self.executor.commit_fact(fact)
            return f"committed {type(fact).__name__} {action.op_id}"
        except GATE_ERRORS as exc:
            self.apply(ActionDropped(action.op_id))
            code = exc.reason if isinstance(exc, ControllerRejected) else type(exc).__name__
            if code in BACKOFF_CODES:
                self.apply(IntentRefused(action.provider, code, self.wall()))
            return f"dropped {type(fact).__name__} {action.op_id}: {exc}"

    def _record(self, outcome: Any) -> None:
        if isinstance(outcome, ReturnOutcome):
            self._note_return(outcome)
        self.outcomes.append(outcome)
        del self.outcomes[:-1000]
        self.wake()

    def _note_return(self, outcome: ReturnOutcome) -> None:
        """Back off a return that failed (exponentially, capped) and say so once it keeps failing."""
        if outcome.status not in RETURN_FAILURES:
            self._return_failures.pop(outcome.op_id, None)
            return
        failures = self._return_failures.get(outcome.op_id, (0, 0.0))[0] + 1
        s = self.settings
        delay = min(s.return_retry_max, s.recover_after * 2 ** min(failures - 1, 32))
        self._return_failures[outcome.op_id] = (failures, trio.current_time() + delay)
        if failures >= s.return_stuck_after:
            self.events.emit(
                "return_stuck",
                op_id=outcome.op_id,
                provider=outcome.provider,
                failures=failures,
                status=outcome.status,
                code=outcome.code,
                detail=outcome.detail[:200],
                retry_in=round(delay, 3),
            )

    # --- recovery -----------------------------------------------------------------------------------------------

    def _recover(self, view: ControllerView, allowed: set[str]) -> None:
        """Hand open intents/returns nobody runs to the executor once idle for ``recover_after`` seconds."""
        now = trio.current_time()
        ex, facts = self.executor, view.facts
        self._settled_ops.intersection_update(facts.open_ops)  # bounded: only ops still open matter
        idle: dict[str, Any] = {}
        for op_id in facts.open_ops:
            intent = facts.intents[op_id].intent
            if intent.provider in allowed and op_id not in ex.busy_ops and op_id not in self._settled_ops:
                idle[op_id] = intent
        open_returns = {op_id for op_id, record in facts.returns.items() if not record.done}
        for op_id in self._return_failures.keys() - open_returns:  # bounded: only returns still open matter
            del self._return_failures[op_id]
        for op_id, record in facts.returns.items():
            if record.done or record.intent.provider not in allowed or op_id in ex.busy_ops:
                continue
            live = [
                m
                for m in record.intent.machine_ids
                if m in facts.machines and facts.machines[m].state is MachineState.RETURNING
            ]
            if live and self.state.capacity.throttled(record.intent.provider, self.wall()) is None:
                idle[op_id] = record.intent
        self._idle_since = {op: self._idle_since.get(op, now) for op in idle}
        for op_id, intent in idle.items():
            if now - self._idle_since[op_id] < self.settings.recover_after:
                continue
            if now < self._return_failures.get(op_id, (0, now))[1]:
                continue  # a return backing off after a failure
            self._idle_since[op_id] = now  # once per recover_after, whatever the outcome
            assert self._nursery is not None
            self._nursery.start_soon(self._run_recovery, intent)

    async def _run_recovery(self, intent: Any) -> None:
        async with self._limiter:
            if hasattr(intent, "token_hashes"):
                outcome = await self.executor.recover_request(intent)
            else:
                outcome = await self.executor.resume_return(intent)
        self._record(outcome)

    # --- reclaims -----------------------------------------------------------------------------------------------

    async def _reclaim_loop(self) -> None:
        while True:
            await trio.sleep(self.settings.reclaim_interval)
            view = self.session.view
            if view is None or self.session.state is not LinkState.UP:
                continue
            for provider in self.leased():
                await self.poll_reclaims(provider, view)

    async def poll_reclaims(self, provider: str, view: ControllerView) -> None:
        """Ask ``provider`` which of its live machines it takes back; fold them as ``Reclaimed``."""
        records = [m for m in view.facts.machines.values() if m.provider == provider and m.state.live]
        if not records:
            return
        names = {m.hostname: m.machine_id for m in records if m.hostname}
        document = {"machines": [{"name": m.hostname, "machineId": m.machine_id} for m in records]}
        try:
            answer = await self.executor.client(provider).call("getReturnRequests", document)
        except ProviderError as exc:
            if isinstance(exc, ProviderRejected) and exc.code == "throttled":
                self.apply(Throttled(provider, self.wall()))
            log.info("getReturnRequests for %s failed: %s", provider, exc)
            return
        known = {m.machine_id for m in records}
        ids = []
        for entry in answer.get("requests", ()):
            machine_id = entry.get("machineId") or names.get(entry.get("machine", ""), "")
            if machine_id in known:
                ids.append(machine_id)
        if ids:
            self.events.emit("reclaimed", provider=provider, machines=sorted(ids))
            self.apply(Reclaimed(provider, tuple(sorted(ids)), self.wall()))
