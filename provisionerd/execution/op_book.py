"""One record per operation this process runs, in one place: where each op stands, from dispatch to settled (issue
31 item 1).

An op's record (``OpRecord``) is made when the op is first claimed (an action dispatched, a recovery, an orphan
return, an admin return) and says:

- ``stage``: where it stands (``Stage``: planned, intent, calling, unknown, polling, facts, recovering, idle,
  settled), set by the flow that runs it as it moves (``enter``), with ``since``, when it got there;
- ``running``: a task of this process runs it now. This is the busy claim: never two actions on one op_id, nor on
  one machine (``machines``), at once; a second claim is refused (``OpBook.claim`` answers ``None``), never queued;
- ``settled``: this process ran the request to a known end, so its open intent is the planner's business (its
  provisioning timeout), not recovery's;
- ``idle_since``: when recovery first saw it open with no task running it (its idle clock), and for a return that
  keeps failing, ``failures`` in a row and ``retry_at``, the end of its back-off;
- ``observations``: what the call running now meant for the planner, in order. Each is also sent at once to the
  reconcile loop on the feedback channel (``execution.feedback``): a throttle seen halfway through a long call acts
  on the next plan, not when the call ends;
- ``action`` and ``planned_at``: for an op the planner planned, what it planned and when, until the op is
  ``dropped`` (an ``ActionDropped`` of its call) or forgotten. The planner keeps no record of its own: each plan
  reads these (``in_flight``, :mod:`provisionerd.planner.in_flight`) and does not plan again what the facts do not
  show yet.

The executor owns the one ``OpBook``; the reconcile loop's ``Operations`` (dispatch and recovery) and the orphan
cycle claim through the executor. Records of ops no longer open in the facts and not running are forgotten
(``keep``), so the book holds at most the open ops plus those running. The durable record of an op is the
controller's log of facts (its intent, instance facts, ``RequestFailed``, ``Returned``); the book is what this
process knows beyond that, and a restart starts it empty (``recovery_rules`` decides from the facts and the
provider's listing).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Set
from typing import Any

import attrs
import trio

from provisionerd.domain.actions import Action, RequestMachines
from provisionerd.planner.in_flight import InFlight, PendingRequest
from provisionerd.planner.state import ActionDropped, Observation


class Stage(enum.Enum):
    PLANNED = "planned"  # claimed, waiting for its turn (the concurrency limiter)
    INTENT = "intent"  # the gate commits its intent
    CALLING = "calling"  # the intent acknowledged, the provider call under way
    UNKNOWN = "unknown"  # the call's outcome is unknown: listed by op tag, perhaps retried with the same op_id
    POLLING = "polling"  # answered, polled to its end
    FACTS = "facts"  # committing what it made (instance facts) or gave back (``Returned``)
    RECOVERING = "recovering"  # open in the facts with no task of ours: being settled (after a restart)
    IDLE = "idle"  # open in the facts, no task running it: recovery's, once idle long enough
    SETTLED = "settled"  # ran to a known end


#: The ops a ``describe`` lists at most (status output stays bounded; the count is given in full).
DESCRIBE_MAX = 200


@attrs.define(eq=False)
class OpRecord:
    op_id: str
    kind: str  # request | return | fail | lost | drain
    provider: str
    machines: tuple[str, ...] = ()
    stage: Stage = Stage.PLANNED
    since: float = 0.0
    running: bool = False
    settled: bool = False
    idle_since: float | None = None
    failures: int = 0
    retry_at: float | None = None
    #: When a fail of this op was first deferred for want of a listing (trio clock; ``None``: never).
    deferred_since: float | None = None
    #: Its run ended with a fact it could not commit (the controller link broke: a failover): its machines exist
    #: with no fact, so the first pass that may recover it does, not one ``recover_after`` later (the demo's drain
    #: step: 3 of 8 workers went unreturned for 27 s after demand 0). Cleared when that recovery starts.
    resume_soon: bool = False
    observations: list[Observation] = attrs.field(factory=list)
    #: What the planner planned for this op and when (wall seconds, the plan's ``now``); ``None``: not planned by
    #: this process's planner (a recovery, an orphan or admin return).
    action: Action | None = None
    planned_at: float = 0.0
    dropped: bool = False  # its call dropped the action: no longer in flight, the planner may plan it again
    _sink: Callable[[Observation], None] = attrs.field(default=lambda obs: None, repr=False)

    def enter(self, stage: Stage) -> None:
        """The op moved on (trio's clock)."""
        self.stage, self.since = stage, trio.current_time()

    def add(self, obs: Observation) -> None:
        """A planner observation of the call running now: kept for its outcome and sent to the loop at once."""
        self.observations.append(obs)
        if isinstance(obs, ActionDropped):
            self.dropped = True
        self._sink(obs)

    def pending_request(self) -> PendingRequest | None:
        """The request the planner planned for this op, if it did (for its step window)."""
        if isinstance(self.action, RequestMachines):
            return PendingRequest.of(self.action, self.planned_at)
        return None

    def take_observations(self) -> tuple[Observation, ...]:
        taken, self.observations = tuple(self.observations), []
        return taken

    def describe(self, now: float) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "op_id": self.op_id,
            "kind": self.kind,
            "provider": self.provider,
            "stage": self.stage.value,
            "for_s": round(max(now - self.since, 0.0), 3),
            "running": self.running,
        }
        if self.machines:
            shown["machines"] = list(self.machines)
        if self.failures:
            shown["failures"] = self.failures
            shown["retry_in_s"] = None if self.retry_at is None else round(max(self.retry_at - now, 0.0), 3)
        return shown


class OpBook:
    """``sink``: where each observation goes the moment a call makes it (the feedback channel)."""

    def __init__(self, sink: Callable[[Observation], None] = lambda obs: None) -> None:
        self._sink = sink
        self._ops: dict[str, OpRecord] = {}
        self._machines: dict[str, str] = {}  # machine id -> the op running on it

    # --- claims -------------------------------------------------------------------------------------------------

    def claim(self, op_id: str, kind: str, provider: str, machines: Collection[str] = ()) -> OpRecord | None:
        """The op's record, now running, if neither it nor any of ``machines`` is running (all or nothing);
        ``None``: busy. Its holder hands it on to the call and gives it back once (``release``)."""
        record = self._ops.get(op_id)
        if (record is not None and record.running) or any(m in self._machines for m in machines):
            return None
        if record is None:
            record = self._ops[op_id] = OpRecord(op_id, kind, provider, sink=self._sink)
        record.kind, record.provider, record.machines = kind, provider, tuple(machines)
        record.running, record.idle_since, record.observations = True, None, []
        record.action, record.planned_at, record.dropped = None, 0.0, False
        record.enter(Stage.PLANNED)
        for machine in record.machines:
            self._machines[machine] = op_id
        return record

    def release(self, record: OpRecord) -> None:
        """The task that ran ``record`` ended: the op is free again (settled, or idle for recovery)."""
        if not record.running:
            return
        record.running = False
        for machine in record.machines:
            if self._machines.get(machine) == record.op_id:
                del self._machines[machine]
        if record.stage is not Stage.SETTLED:
            record.enter(Stage.IDLE)

    def is_running(self, op_id: str) -> bool:
        record = self._ops.get(op_id)
        return record is not None and record.running

    @property
    def running_ops(self) -> Set[str]:
        """The op_ids a task runs now (a copy)."""
        return frozenset(op for op, record in self._ops.items() if record.running)

    @property
    def busy_machines(self) -> Set[str]:
        """The machines an op runs on now (a copy)."""
        return frozenset(self._machines)

    def plan(self, record: OpRecord, action: Action, planned_at: float) -> None:
        """``record`` (just claimed) runs ``action``, which the planner planned at ``planned_at``."""
        record.action, record.planned_at = action, planned_at

    def in_flight(self) -> InFlight:
        """The planned actions not dropped, of every op still in the book (the planner keeps only those the facts
        do not show yet: ``InFlight.unseen``)."""
        planned = self._ops.values()
        return InFlight.of((r.action, r.planned_at) for r in planned if r.action is not None and not r.dropped)

    # --- what the loop keeps of each op -------------------------------------------------------------------------

    def get(self, op_id: str) -> OpRecord | None:
        return self._ops.get(op_id)

    def settle(self, record: OpRecord) -> None:
        """This process ran ``record``'s request to a known end: its open intent is the planner's business."""
        record.settled = True
        record.enter(Stage.SETTLED)

    def settled(self, op_id: str) -> bool:
        record = self._ops.get(op_id)
        return record is not None and record.settled

    def note_return(self, op_id: str, failed: bool, delay: Callable[[int], float]) -> int:
        """A return's call ended: a failure backs it off (``delay(failures in a row)`` seconds), a success forgets
        its failures. The failures in a row now."""
        record = self._ops.get(op_id)
        if record is None:
            return 0
        if not failed:
            record.failures, record.retry_at = 0, None
            return 0
        record.failures += 1
        record.retry_at = trio.current_time() + delay(record.failures)
        return record.failures

    def failing_returns(self) -> dict[str, int]:
        """Each failing return's op_id and its failures in a row."""
        return {op: r.failures for op, r in self._ops.items() if r.failures}

    def idle_clock(self, op_id: str, kind: str, provider: str, since: float) -> OpRecord:
        """The record of an op open in the facts that no task runs, its idle clock started at ``since`` if it had
        none (an op this process never ran gets its first record here)."""
        record = self._ops.get(op_id)
        if record is None:
            record = self._ops[op_id] = OpRecord(op_id, kind, provider, stage=Stage.IDLE, since=since, sink=self._sink)
        if record.idle_since is None:
            record.idle_since = since
        return record

    def forget_idle(self) -> None:
        """Start every idle clock over (a new controller view: what was idle in the old one says nothing)."""
        for record in self._ops.values():
            record.idle_since = None

    def keep(self, open_ops: Collection[str]) -> None:
        """Forget the records of ops neither open in the facts nor running (bounded: the open ops and the running
        ones only)."""
        opened = open_ops if isinstance(open_ops, (set, frozenset, dict)) else set(open_ops)
        for op_id in [op for op, r in self._ops.items() if not r.running and op not in opened]:
            del self._ops[op_id]

    def stop_idle_clocks(self, keep: Collection[str]) -> None:
        """Stop the idle clock of every op not in ``keep`` (not idle now: its clock starts over when it is)."""
        for op_id, record in self._ops.items():
            if record.idle_since is not None and op_id not in keep:
                record.idle_since = None

    def describe(self) -> dict[str, Any]:
        """For ``provisionerd status``: how many ops this process holds, how many run, and each (oldest stage
        first, at most ``DESCRIBE_MAX``)."""
        now = trio.current_time()
        records = sorted(self._ops.values(), key=lambda r: (r.since, r.op_id))
        return {
            "count": len(records),
            "running": sum(1 for r in records if r.running),
            "ops": [r.describe(now) for r in records[:DESCRIBE_MAX]],
        }

    def __len__(self) -> int:
        return len(self._ops)
