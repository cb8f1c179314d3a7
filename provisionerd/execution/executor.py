"""The executor: runs planned actions against a provider, every mutation through the mutation gate.

``Executor`` is the facade the daemon, the reconcile loop, the orphan cycle and the admin actions use. It holds no
flow itself; it builds one value of dependencies (``steps.FlowDeps``: settings, provider clients, gate, facts,
events, wall clock) and hands it to collaborators that each do one job, readable top to bottom in their module:

- ``request_flow.RequestFlow``: one ``RequestMachines`` action (tokens, gate, ``requestMachines``, poll, instance
  facts), and the recovery of an open intent no task runs (``recover_request``);
- ``unknown_outcome.UnknownOutcomeFlow``: after a ``requestMachines`` whose outcome is unknown (list by op tag,
  same-op retry only on an idempotent provider, settle);
- ``legacy_requests.LegacyRequestFlow``: what replaces that for a legacy LSF plugin;
- ``returns.ReturnFlow``: ``ReturnIntent`` through the gate, ``requestReturnMachines``/``stopMachines``, poll,
  ``Returned``. Returns hold no secret, so an unknown outcome (or a restart) is simply retried with the same op_id
  (``resume_return``), each call through the gate;
- ``steps.Steps``: the steps they share (list an op, poll a request, commit instance facts, settle a refusal);
  ``facts.LeasedFacts``: the fact view and the commits stamped with the lease epoch held now;
  ``observations``: what a provider error or a gate refusal means for the planner, in one place.

The executor owns the one record of every op this process runs (``op_book.OpBook``: where it stands, whether a
task runs it, its idle clock and return back-off). It never runs two actions on one op_id or one machine at once:
the loop's ``Operations`` claims through it (``claim``) and hands the ``OpRecord`` to the call, and a call that
finds its op or machines running returns ``dropped`` (``code="busy"``) at once. Planner observations go to the
reconcile loop on the ``feedback`` channel as they happen (``execution.feedback``) and are also returned in the
outcome. Join tokens never reach an event, a log line or an outcome.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence, Set
from contextlib import asynccontextmanager

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.model import NO_EPOCH, Fact, RequestIntent, ReturnIntent
from provisionerd.execution.facts import LeasedFacts
from provisionerd.execution.feedback import tell
from provisionerd.execution.gate import FactCommitter, MutationGate
from provisionerd.execution.legacy_requests import LegacyRequestFlow
from provisionerd.execution.op_book import OpBook, OpRecord, Stage
from provisionerd.execution.provider_features import FeatureBook
from provisionerd.execution.request_flow import RequestFlow
from provisionerd.execution.returns import ReturnFlow
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.unknown_outcome import UnknownOutcomeFlow
from provisionerd.execution.values import GATE_ERRORS, ExecutorSettings, RequestOutcome, ReturnOutcome
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.state import Observation
from provisionerd.provider.client import ProviderClient
from provisionerd.telemetry.events import EventLog

__all__ = ["GATE_ERRORS", "Executor", "ExecutorSettings", "RequestOutcome", "ReturnOutcome"]


class Executor:
    def __init__(
        self,
        settings: ExecutorSettings,
        clients: Mapping[str, ProviderClient],
        gate: MutationGate,
        leases: Mapping[str, LeaseKeeper],
        committer: FactCommitter,
        events: EventLog,
        *,
        facts: Callable[[], FactView | None] = lambda: None,
        wall: Callable[[], float] = time.time,
        feedback: trio.MemorySendChannel[Observation] | None = None,
    ) -> None:
        self.settings = settings
        self._feedback = feedback
        self._clients = clients
        self._committer = committer
        self._facts = LeasedFacts(leases, committer, facts)
        deps = FlowDeps(settings, clients, gate, self._facts, events, wall)
        self._steps = Steps(deps)
        self._legacy = LegacyRequestFlow(deps, self._steps)
        #: Each provider's ``describeProvider`` features, asked once (the offer feed reads it too).
        self.features = FeatureBook(clients)
        unknown = UnknownOutcomeFlow(deps, self._steps, self.features)
        self._requests = RequestFlow(deps, self._steps, unknown, self._legacy)
        self._returns = ReturnFlow(deps, self._steps)
        #: The one record of every op this process runs (``op_book``).
        self.ops = OpBook(self._tell)

    def _tell(self, obs: Observation) -> None:
        tell(self._feedback, obs)

    def serves(self, provider: str) -> bool:
        return provider in self._clients

    def client(self, provider: str) -> ProviderClient:
        """The provider client of ``provider`` (``KeyError`` if this daemon does not serve it)."""
        return self._clients[provider]

    # --- op records -------------------------------------------------------------------------------------------

    def claim(self, op_id: str, kind: str, provider: str, machine_ids: Collection[str] = ()) -> OpRecord | None:
        """The op's record, claimed for an action about to run, if neither it nor its machines run now (``None``:
        busy). The reconcile loop claims when it plans (its task may start after the next cycle), hands the record
        to the call (``request``/``return_machines``: they then do not claim again) and releases it when the call
        ends."""
        return self.ops.claim(op_id, kind, provider, machine_ids)

    def release(self, record: OpRecord) -> None:
        self.ops.release(record)

    def is_busy(self, op_id: str) -> bool:
        return self.ops.is_running(op_id)

    @property
    def busy_ops(self) -> Set[str]:
        """The op_ids an action runs on now (read-only: claim through ``claim``)."""
        return self.ops.running_ops

    @property
    def busy_machines(self) -> Set[str]:
        """The machines an action runs on now (read-only)."""
        return self.ops.busy_machines

    @asynccontextmanager
    async def _held(
        self, record: OpRecord | None, op_id: str, kind: str, provider: str, machines: Collection[str] = ()
    ) -> AsyncIterator[OpRecord | None]:
        """``record`` when the caller holds it; else the op claimed here for the call and released after it
        (``None``: busy)."""
        held = record if record is not None else self.ops.claim(op_id, kind, provider, machines)
        try:
            yield held
        finally:
            if record is None and held is not None:
                self.ops.release(held)

    # --- facts --------------------------------------------------------------------------------------------------

    async def commit_fact(self, fact: Fact) -> int:
        """Commit a non-mutating fact stamped with the current lease epoch; its log index.

        Raises ``LeaseError`` (no valid lease), ``ControllerRejected`` (a lease-lost rejection also lapses the
        keeper) or ``LinkDown`` (outcome unknown)."""
        return await self._facts.commit(fact)

    # --- requests -----------------------------------------------------------------------------------------------

    async def request(self, action: RequestMachines, *, record: OpRecord | None = None) -> RequestOutcome:
        """Run one ``RequestMachines`` action to its end (``request_flow``). ``record``: the op's, held by the
        caller (then not claimed again here, nor released)."""
        async with self._held(record, action.op_id, "request", action.provider) as held:
            if held is None:
                return RequestOutcome(action.op_id, action.provider, "dropped", code="busy")
            outcome = await self._requests.run(held, action)
            outcome = attrs.evolve(outcome, observations=held.take_observations())
        self._steps.emit(
            "result",
            "request",
            action.op_id,
            action.provider,
            status=outcome.status,
            machines=len(outcome.machine_ids),
            code=outcome.code,
            detail=outcome.detail,
        )
        return outcome

    async def recover_request(self, intent: RequestIntent, *, record: OpRecord | None = None) -> RequestOutcome:
        """Settle an open intent no task is running (after a restart): ``request_flow`` ("After a restart")."""
        op_id, provider = intent.op_id, intent.provider
        if provider not in self._clients:
            return RequestOutcome(op_id, provider, "dropped", code="busy")
        async with self._held(record, op_id, "request", provider) as held:
            if held is None:
                return RequestOutcome(op_id, provider, "dropped", code="busy")
            held.enter(Stage.RECOVERING)
            return await self._requests.recover(intent)

    async def attribute_op(self, intent: RequestIntent, *, unlistable_as_empty: bool = False) -> tuple[str, ...] | None:
        """List ``intent``'s op and commit an InstanceFact for each machine found not in the facts yet; the machine
        ids (``None`` when the listing or a commit failed). Called before the op is failed: a machine a hung call
        created after the deadline would otherwise have no fact and stay unattributed. ``unlistable_as_empty``:
        ``Steps.list_op``."""
        return await self._requests.attribute_op(intent, unlistable_as_empty=unlistable_as_empty)

    # --- returns ------------------------------------------------------------------------------------------------

    async def return_machines(
        self,
        provider: str,
        op_id: str,
        machine_ids: Sequence[str],
        reason: str,
        *,
        stop: bool = False,
        record: OpRecord | None = None,
    ) -> ReturnOutcome:
        """Gate with a ``ReturnIntent``, call ``requestReturnMachines`` (``stopMachines`` with ``stop``), poll to
        completion, commit ``Returned``. Raises nothing: every failure is in the outcome. ``record``: as for
        ``request``."""
        ids = tuple(machine_ids)
        if not ids:
            raise ValueError("return_machines needs at least one machine id")
        return await self._return(ReturnIntent(provider, NO_EPOCH, op_id, ids, reason), stop, record)

    async def resume_return(
        self, intent: ReturnIntent, *, stop: bool = False, record: OpRecord | None = None
    ) -> ReturnOutcome:
        """Drive a committed return intent no task is running (unknown outcome, restart) with its own op_id."""
        return await self._return(intent, stop, record)

    async def _return(self, intent: ReturnIntent, stop: bool, record: OpRecord | None = None) -> ReturnOutcome:
        op_id, ids = intent.op_id, intent.machine_ids
        async with self._held(record, op_id, "return", intent.provider, ids) as held:
            if held is None:
                return ReturnOutcome(op_id, intent.provider, "dropped", code="busy")
            outcome = await self._returns.run(held, intent, stop)
            outcome = attrs.evolve(outcome, observations=held.take_observations())
        self._steps.emit(
            "result",
            "return",
            outcome.op_id,
            outcome.provider,
            status=outcome.status,
            machines=len(outcome.returned),
            code=outcome.code,
            detail=outcome.detail,
        )
        return outcome
