"""Fold the controller's committed facts into the daemon's view of intents and machines.

Pure and synchronous. The daemon rebuilds this from a resync after every (re)join, so it is the only memory the
reconciler and the orphan classifier may trust. Folding the same facts twice gives the same view; facts arrive in
log order (``CommittedFact.index``) and a fact already folded (index not above ``last_index``) changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from provisionerd.model import (
    CommittedFact,
    Epoch,
    InstanceFact,
    Lost,
    NO_EPOCH,
    OrphanAdopted,
    OrphanReported,
    RequestFailed,
    RequestIntent,
    ReturnIntent,
    Returned,
)


class MachineState(enum.Enum):
    ACTIVE = "active"  # created for us and not (yet) on its way back
    RETURNING = "returning"  # return intent committed, not confirmed returned
    RETURNED = "returned"
    LOST = "lost"

    @property
    def live(self) -> bool:
        return self in (MachineState.ACTIVE, MachineState.RETURNING)


@attrs.define
class MachineRecord:
    provider: str
    machine_id: str
    instance_ref: str
    op_id: str
    template_id: str
    token_hash: str
    hostname: str
    address: str
    launch_time: float
    state: MachineState = MachineState.ACTIVE
    return_op: str = ""
    adopted: bool = False


@attrs.define
class IntentRecord:
    intent: RequestIntent
    machine_ids: list[str] = attrs.field(factory=list)
    failed_reason: str = ""

    @property
    def open(self) -> bool:
        """Still waiting for machines: neither fulfilled nor ended by a ``RequestFailed``."""
        return not self.failed_reason and len(self.machine_ids) < self.intent.count

    @property
    def outstanding(self) -> int:
        return self.intent.count - len(self.machine_ids) if self.open else 0


@attrs.define
class ReturnRecord:
    intent: ReturnIntent
    done: bool = False


@attrs.define
class FactView:
    """Everything the facts say. Mutable while folding; treat as read-only once built."""

    intents: dict[str, IntentRecord] = attrs.field(factory=dict)  # op_id -> record
    machines: dict[str, MachineRecord] = attrs.field(factory=dict)  # machine_id -> record
    returns: dict[str, ReturnRecord] = attrs.field(factory=dict)  # op_id -> record
    reported_orphans: dict[str, OrphanReported] = attrs.field(factory=dict)  # machine_id -> latest report
    latest_epoch: dict[str, Epoch] = attrs.field(factory=dict)  # provider -> epoch on its latest fact
    last_index: int = 0

    def live_machines(self, provider: str | None = None) -> list[MachineRecord]:
        return [
            m for m in self.machines.values() if m.state.live and (provider is None or m.provider == provider)
        ]

    def open_intents(self, provider: str | None = None) -> list[IntentRecord]:
        return [
            r for r in self.intents.values() if r.open and (provider is None or r.intent.provider == provider)
        ]

    def epoch_of(self, provider: str) -> Epoch:
        return self.latest_epoch.get(provider, NO_EPOCH)

    def apply(self, committed: CommittedFact) -> None:
        """Fold one fact. Facts at or below ``last_index`` were folded already and are ignored."""
        if committed.index <= self.last_index:
            return
        self.last_index = committed.index
        fact = committed.fact
        current = self.latest_epoch.get(fact.provider, NO_EPOCH)
        self.latest_epoch[fact.provider] = max(current, fact.epoch)
        match fact:
            case RequestIntent():
                self.intents.setdefault(fact.op_id, IntentRecord(fact))
            case InstanceFact():
                self._add_instance(fact)
            case RequestFailed():
                record = self.intents.get(fact.op_id)
                if record is not None and not record.failed_reason:
                    record.failed_reason = fact.reason
            case ReturnIntent():
                self.returns.setdefault(fact.op_id, ReturnRecord(fact))
                for machine_id in fact.machine_ids:
                    machine = self.machines.get(machine_id)
                    if machine is not None and machine.state is MachineState.ACTIVE:
                        machine.state = MachineState.RETURNING
                        machine.return_op = fact.op_id
            case Returned():
                if fact.op_id in self.returns:
                    self.returns[fact.op_id].done = True
                for machine_id in fact.machine_ids:
                    machine = self.machines.get(machine_id)
                    if machine is not None and machine.state.live:
                        machine.state = MachineState.RETURNED
            case Lost():
                machine = self.machines.get(fact.machine_id)
                if machine is not None and machine.state.live:
                    machine.state = MachineState.LOST
            case OrphanReported():
                self.reported_orphans[fact.machine_id] = fact
            case OrphanAdopted():
                self.machines.setdefault(
                    fact.machine_id,
                    MachineRecord(
                        provider=fact.provider,
                        machine_id=fact.machine_id,
                        instance_ref=fact.instance_ref,
                        op_id=fact.op_id,
                        template_id="",
                        token_hash="",
                        hostname=fact.hostname,
                        address=fact.address,
                        launch_time=0.0,
                        adopted=True,
                    ),
                )
                self.reported_orphans.pop(fact.machine_id, None)

    def _add_instance(self, fact: InstanceFact) -> None:
        if fact.machine_id in self.machines:
            return  # the same machine reported twice (a retried status poll): one record
        self.machines[fact.machine_id] = MachineRecord(
            provider=fact.provider,
            machine_id=fact.machine_id,
            instance_ref=fact.instance_ref,
            op_id=fact.op_id,
            template_id=fact.template_id,
            token_hash=fact.token_hash,
            hostname=fact.hostname,
            address=fact.address,
            launch_time=fact.launch_time,
        )
        record = self.intents.get(fact.op_id)
        if record is not None and fact.machine_id not in record.machine_ids:
            record.machine_ids.append(fact.machine_id)


def fold(facts: Iterable[CommittedFact], view: FactView | None = None) -> FactView:
    """Fold ``facts`` (in log order) into ``view`` (a new one by default) and return it."""
    view = FactView() if view is None else view
    for committed in facts:
        view.apply(committed)
    return view
