"""Fold the controller's committed facts into the daemon's view of intents and machines.

Pure and synchronous. The daemon rebuilds this from a resync after every (re)join, so it is the only memory the
reconciler and the orphan classifier may trust. Folding the same facts twice gives the same view; facts arrive in
log order (``CommittedFact.index``) and a fact already folded (index not above ``last_index``) changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from provisionerd.domain.model import (
    NO_EPOCH,
    NO_QUOTE,
    CommittedFact,
    Epoch,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    PriceQuote,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from provisionerd.planner.host_table import HostTable


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
    demand_id: str = ""  # the demand item its intent served ("" for adopted machines)
    price: PriceQuote = NO_QUOTE  # the quote it was chosen at (InstanceFact.price; planner.cost)
    ended_at: float = 0.0  # wall seconds its return was confirmed (Returned.at; 0 = live or unknown)


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
    #: Every fact of our providers up to this log index is folded (the last resync's ``as_of``); above it only
    #: ``folded_above``: what this daemon committed since. An incremental resync sends what is above it.
    synced_to: int = 0
    folded_above: set[int] = attrs.field(factory=set)
    # Indexes kept in step with the records on every change, so the planner need not scan 100k machines:
    active_refs: dict[str, MachineRecord] = attrs.field(factory=dict)  # instance_ref -> ACTIVE machine
    active_by_demand: dict[str, int] = attrs.field(factory=dict)  # demand_id -> ACTIVE machines
    live_by_offer: dict[tuple[str, str], int] = attrs.field(factory=dict)  # (provider, template) -> live machines
    open_ops: dict[str, None] = attrs.field(factory=dict)  # op_ids of open intents, in commit order
    open_returns: dict[str, None] = attrs.field(factory=dict)  # op_ids of returns not confirmed, in commit order
    # The controller's hosts, joined against ``active_refs`` as both change (see provisionerd.planner.host_table). Owned
    # here because only the view sees every machine change; a holder of hosts may use it as its dict of hosts.
    hosts: HostTable = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.hosts = HostTable(self.active_refs)

    def live_machines(self, provider: str | None = None) -> list[MachineRecord]:
        return [m for m in self.machines.values() if m.state.live and (provider is None or m.provider == provider)]

    def open_intents(self, provider: str | None = None) -> list[IntentRecord]:
        return [r for r in self.intents.values() if r.open and (provider is None or r.intent.provider == provider)]

    def epoch_of(self, provider: str) -> Epoch:
        return self.latest_epoch.get(provider, NO_EPOCH)

    def apply(self, committed: CommittedFact) -> None:
        """Fold one fact. Facts at or below ``last_index`` were folded already and are ignored."""
        if committed.index <= self.last_index:
            return
        self.last_index = committed.index
        if self.synced_to:  # only once synced: a view folded from scratch marks its sync point after (mark_synced)
            self.folded_above.add(committed.index)
        self._fold(committed)

    def mark_synced(self, as_of: int) -> None:
        """A full resync as of log index ``as_of`` is folded (0: the controller did not say: no incremental)."""
        self.synced_to = as_of
        self.folded_above = set()

    def apply_after_sync(self, facts: Iterable[CommittedFact], as_of: int) -> None:
        """Fold an incremental resync: every fact of our providers after ``synced_to`` up to ``as_of``, in log
        order. Those folded already (this daemon's own commits, ``folded_above``) are skipped; the others are
        folded even when below ``last_index`` (another provider's facts between our own commits: facts of
        different providers commute, and one provider's facts come in log order)."""
        for committed in facts:
            if committed.index <= self.synced_to or committed.index in self.folded_above:
                continue
            self.last_index = max(self.last_index, committed.index)
            self._fold(committed)
        self.synced_to = max(self.synced_to, as_of)
        self.folded_above = {i for i in self.folded_above if i > self.synced_to}

    def _fold(self, committed: CommittedFact) -> None:
        fact = committed.fact
        current = self.latest_epoch.get(fact.provider, NO_EPOCH)
        self.latest_epoch[fact.provider] = max(current, fact.epoch)
        match fact:
            case RequestIntent():
                if fact.op_id not in self.intents:
                    intent = self.intents[fact.op_id] = IntentRecord(fact)
                    if intent.open:
                        self.open_ops[fact.op_id] = None
            case InstanceFact():
                self._add_instance(fact)
            case RequestFailed():
                record = self.intents.get(fact.op_id)
                if record is not None and not record.failed_reason:
                    record.failed_reason = fact.reason
                    self.open_ops.pop(fact.op_id, None)
            case ReturnIntent():
                if fact.op_id not in self.returns:
                    self.returns[fact.op_id] = ReturnRecord(fact)
                    self.open_returns[fact.op_id] = None
                for machine_id in fact.machine_ids:
                    machine = self.machines.get(machine_id)
                    if machine is not None and machine.state is MachineState.ACTIVE:
                        self._set_state(machine, MachineState.RETURNING)
                        machine.return_op = fact.op_id
            case Returned():
                if fact.op_id in self.returns:
                    self.returns[fact.op_id].done = True
                    self.open_returns.pop(fact.op_id, None)
                for machine_id in fact.machine_ids:
                    machine = self.machines.get(machine_id)
                    if machine is not None and machine.state.live:
                        self._set_state(machine, MachineState.RETURNED)
                        machine.ended_at = fact.at
            case Lost():
                machine = self.machines.get(fact.machine_id)
                if machine is not None and machine.state.live:
                    self._set_state(machine, MachineState.LOST)
            case OrphanReported():
                self.reported_orphans[fact.machine_id] = fact
            case OrphanAdopted():
                if fact.machine_id not in self.machines:
                    self._track(
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
                        )
                    )
                self.reported_orphans.pop(fact.machine_id, None)

    def _add_instance(self, fact: InstanceFact) -> None:
        if fact.machine_id in self.machines:
            return  # the same machine reported twice (a retried status poll): one record
        record = self.intents.get(fact.op_id)
        self._track(
            MachineRecord(
                provider=fact.provider,
                machine_id=fact.machine_id,
                instance_ref=fact.instance_ref,
                op_id=fact.op_id,
                template_id=fact.template_id,
                token_hash=fact.token_hash,
                hostname=fact.hostname,
                address=fact.address,
                launch_time=fact.launch_time,
                demand_id="" if record is None else record.intent.demand_id,
                price=fact.price,
            )
        )
        # An instance fact explains the machine: an earlier orphan report about it no longer stands.
        self.reported_orphans.pop(fact.machine_id, None)
        if record is not None and fact.machine_id not in record.machine_ids:
            record.machine_ids.append(fact.machine_id)
            if not record.open:
                self.open_ops.pop(fact.op_id, None)

    def _track(self, machine: MachineRecord) -> None:
        """Add a new ACTIVE machine to the records and the indexes."""
        self.machines[machine.machine_id] = machine
        if machine.instance_ref and machine.instance_ref not in self.active_refs:
            self.active_refs[machine.instance_ref] = machine
            self.hosts.machine_added(machine)
        self.active_by_demand[machine.demand_id] = self.active_by_demand.get(machine.demand_id, 0) + 1
        key = (machine.provider, machine.template_id)
        self.live_by_offer[key] = self.live_by_offer.get(key, 0) + 1

    def _set_state(self, machine: MachineRecord, state: MachineState) -> None:
        """Move ``machine`` to ``state``, keeping the indexes in step."""
        old = machine.state
        machine.state = state
        if old is MachineState.ACTIVE and state is not MachineState.ACTIVE:
            if self.active_refs.get(machine.instance_ref) is machine:
                del self.active_refs[machine.instance_ref]
                self.hosts.machine_removed(machine)
            self.active_by_demand[machine.demand_id] -= 1
        if old.live and not state.live:
            self.live_by_offer[(machine.provider, machine.template_id)] -= 1


def fold(facts: Iterable[CommittedFact], view: FactView | None = None) -> FactView:
    """Fold ``facts`` (in log order) into ``view`` (a new one by default) and return it."""
    view = FactView() if view is None else view
    for committed in facts:
        view.apply(committed)
    return view
