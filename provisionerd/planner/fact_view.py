"""Fold the controller's committed facts into the daemon's view of intents and machines.

Pure and synchronous. The daemon rebuilds this from a resync after every (re)join, so it is the only memory the
reconciler and the orphan classifier may trust. Folding the same facts twice gives the same view; facts arrive in
log order (``CommittedFact.index``) and a fact already folded (index not above ``last_index``) changes nothing.

A view made with ``prune=True`` (the daemon's, ``controller/view.py``) holds live state only: a lifecycle that
ended is dropped as it ends, by the rules the controller uses to take it out of the resync set (docs/protocol.md
§6.3, "History"; ``refcontroller/store_lifecycle.py``): a request op ends when it is closed (failed, or as many
machines as it asked for) and every machine it brought is returned or lost; its intent, its machines, the orphan
reports about them and their hosts go, and so does every return whose machines all ended. An adopted machine, or
one whose intent is not in the view (a late machine of an op that ended), ends on its own when it is gone. So the
view an incremental resync folds holds what a full resync would give, not every machine since the daemon started.
Without ``prune`` (an audit fold of the whole log) every record stays.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from provisionerd.domain.model import (
    NO_EPOCH,
    NO_QUOTE,
    RELEASE_ON_COMPLETION,
    CommittedFact,
    DrainRequested,
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
from provisionerd.planner.demand_balance import DemandBalance
from provisionerd.planner.host_table import HostTable


class MachineState(enum.Enum):
    ACTIVE = "active"  # created for us and not (yet) on its way back
    RETURNING = "returning"  # return intent committed, not confirmed returned
    RETURNED = "returned"
    LOST = "lost"

    #: ACTIVE or RETURNING. A plain attribute of each member (set below), not a property: it is read once per
    #: record in passes over 100k of them, and a property call cost 12x the read (0.38 against 0.03 us).
    live: bool


for _state in MachineState:
    _state.live = _state in (MachineState.ACTIVE, MachineState.RETURNING)
del _state


@attrs.define
class MachineRecord:
    provider: str
    machine_id: str
    instance_ref: str
    op_id: str
    template_id: str
    hostname: str
    address: str
    launch_time: float
    state: MachineState = MachineState.ACTIVE
    return_op: str = ""
    adopted: bool = False
    demand_id: str = ""  # the demand item its intent served ("" for adopted machines)
    price: PriceQuote = NO_QUOTE  # the quote it was chosen at (InstanceFact.price; planner.cost)
    ended_at: float = 0.0  # wall seconds its return was confirmed (Returned.at; 0 = live or unknown)
    drain_since: float = 0.0  # wall seconds its drain was asked (the first DrainRequested.at; 0 = not draining)
    instance_type: str = ""  # the type it really got, when its plugin said (InstanceFact.instance_type)

    def __lt__(self, other: MachineRecord) -> bool:
        """By launch time, then instance_ref and machine id: ``host_table``'s launch-time heaps hold the records
        themselves as their entries, not a ``(launch_time, ref, machine_id)`` tuple each (64 bytes a machine)."""
        if self.launch_time != other.launch_time:
            return self.launch_time < other.launch_time
        return (self.instance_ref, self.machine_id) < (other.instance_ref, other.machine_id)


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
    drained: dict[str, MachineRecord] = attrs.field(factory=dict)  # machine_id -> ACTIVE machine asked to drain
    #: op_ids of all-or-nothing intents that ended short with machines made (``planner.gang``: they are returned);
    #: an op leaves when its lifecycle ends.
    broken_gangs: dict[str, None] = attrs.field(factory=dict)
    #: op_ids of intents made for a reservation with release on completion (``planner.release`` reads only their
    #: machines; none, the common case, costs a pass nothing); an op leaves when its lifecycle ends.
    on_completion: dict[str, None] = attrs.field(factory=dict)
    # The controller's hosts, joined against ``active_refs`` as both change (see provisionerd.planner.host_table). Owned
    # here because only the view sees every machine change; a holder of hosts may use it as its dict of hosts.
    hosts: HostTable = attrs.field(init=False)
    #: provider -> live machines: ``live_by_offer`` summed per provider, kept with it (derived at construction).
    live_by_provider: dict[str, int] = attrs.field(init=False)
    #: The demand items short of and over a snapshot's wanted counts, kept as ``active_by_demand`` changes
    #: (:mod:`provisionerd.planner.demand_balance`).
    balance: DemandBalance = attrs.field(init=False, eq=False, repr=False)
    #: Drop ended lifecycles as they end (the module's docstring); the daemon's view does, an audit fold does not.
    prune: bool = False
    # Kept only with ``prune``: per request op in the view, its machines not yet returned or lost; per live return,
    # the machines it names whose lifecycle has not ended; per machine, the live returns that name it.
    _live_of_op: dict[str, int] = attrs.field(init=False, factory=dict)
    _return_left: dict[str, set[str]] = attrs.field(init=False, factory=dict)
    _returns_naming: dict[str, list[str]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self.hosts = HostTable(self.active_refs)
        self.live_by_provider = {}
        for (provider, _), n in self.live_by_offer.items():
            self.live_by_provider[provider] = self.live_by_provider.get(provider, 0) + n
        self.balance = DemandBalance(self.active_by_demand)

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
        epoch, current = fact.epoch, self.latest_epoch.get(fact.provider, NO_EPOCH)
        # max(current, epoch) by the fields: attrs' generated ordering builds two tuples through generators per
        # call (a third of a 100k-fact resync's fold)
        if epoch is not current and (epoch.term, epoch.seq) > (current.term, current.seq):
            self.latest_epoch[fact.provider] = epoch
        elif fact.provider not in self.latest_epoch:
            self.latest_epoch[fact.provider] = current
        match fact:
            case RequestIntent():
                if fact.op_id not in self.intents:
                    intent = self.intents[fact.op_id] = IntentRecord(fact)
                    if intent.open:
                        self.open_ops[fact.op_id] = None
                    else:
                        self._close(intent)
                    if fact.release == RELEASE_ON_COMPLETION:
                        self.on_completion[fact.op_id] = None
            case InstanceFact():
                self._add_instance(fact)
            case RequestFailed():
                record = self.intents.get(fact.op_id)
                if record is not None and not record.failed_reason:
                    record.failed_reason = fact.reason
                    self._close(record)
                    self._check_gang(record)
                    if self.prune and not self._live_of_op.get(fact.op_id):
                        self._end_op(fact.op_id)
            case ReturnIntent():
                if fact.op_id not in self.returns:
                    self.returns[fact.op_id] = ReturnRecord(fact)
                    self.open_returns[fact.op_id] = None
                    if self.prune:
                        # A machine not in the view counts as live, as the controller counts it (an orphan's return
                        # names a machine that has no fact): the return stays until its named machines end.
                        self._return_left[fact.op_id] = set(fact.machine_ids)
                        for machine_id in set(fact.machine_ids):
                            self._returns_naming.setdefault(machine_id, []).append(fact.op_id)
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
                            hostname=fact.hostname,
                            address=fact.address,
                            launch_time=0.0,
                            adopted=True,
                        )
                    )
                self.reported_orphans.pop(fact.machine_id, None)
            case DrainRequested():  # planner.drain: the first drain of a live machine counts
                for machine_id in fact.machine_ids:
                    machine = self.machines.get(machine_id)
                    if machine is not None and machine.state.live and not machine.drain_since > 0:
                        machine.drain_since = fact.at
                        if machine.state is MachineState.ACTIVE:
                            self.drained[machine_id] = machine

    def _add_instance(self, fact: InstanceFact) -> None:
        if fact.machine_id in self.machines:
            return  # the same machine reported twice (a retried status poll): one record
        record = self.intents.get(fact.op_id)
        ref = _shared_ref(record, fact)
        # The quote as a shared object when it is the same (``NO_QUOTE``, or the intent's: every machine of an
        # intent is chosen at its quote): a decoded fact brings its own copy, ~100 bytes a machine that a view of
        # 100,000 machines would hold apart (live_100k daemon RSS 153 -> 142 MB).
        price = fact.price
        if not price.currency and price == NO_QUOTE:
            price = NO_QUOTE
        elif record is not None and price == record.intent.price:
            price = record.intent.price
        self._track(
            MachineRecord(
                provider=fact.provider,
                machine_id=fact.machine_id,
                instance_ref=ref,
                op_id=fact.op_id if record is None else record.intent.op_id,
                template_id=fact.template_id,
                hostname=fact.hostname,
                address=fact.address,
                launch_time=fact.launch_time,
                demand_id="" if record is None else record.intent.demand_id,
                price=price,
                instance_type=fact.instance_type,
            )
        )
        # An instance fact explains the machine: an earlier orphan report about it no longer stands.
        self.reported_orphans.pop(fact.machine_id, None)
        if record is not None and fact.machine_id not in record.machine_ids:
            record.machine_ids.append(fact.machine_id)
            if self.prune:
                self._live_of_op[fact.op_id] = self._live_of_op.get(fact.op_id, 0) + 1
            if not record.open:
                self._close(record)
            self._check_gang(record)

    def _close(self, record: IntentRecord) -> None:
        """``record``'s op is no longer open (fulfilled, or ended by a ``RequestFailed``): out of ``open_ops``, and
        its intent without the join token hashes it no longer needs (``_spent``)."""
        self.open_ops.pop(record.intent.op_id, None)
        record.intent = _spent(record.intent)

    def _check_gang(self, record: IntentRecord) -> None:
        """An all-or-nothing op that ended short with machines made is broken (``planner.gang``)."""
        intent = record.intent
        if intent.all_or_nothing and record.failed_reason and 0 < len(record.machine_ids) < intent.count:
            self.broken_gangs[intent.op_id] = None

    def _track(self, machine: MachineRecord) -> None:
        """Add a new ACTIVE machine to the records and the indexes."""
        self.machines[machine.machine_id] = machine
        if machine.instance_ref and machine.instance_ref not in self.active_refs:
            self.active_refs[machine.instance_ref] = machine
            self.hosts.machine_added(machine)
        active = self.active_by_demand[machine.demand_id] = self.active_by_demand.get(machine.demand_id, 0) + 1
        self.balance.counted(machine.demand_id, active)
        key = (machine.provider, machine.template_id)
        self.live_by_offer[key] = self.live_by_offer.get(key, 0) + 1
        self.live_by_provider[machine.provider] = self.live_by_provider.get(machine.provider, 0) + 1

    def _set_state(self, machine: MachineRecord, state: MachineState) -> None:
        """Move ``machine`` to ``state``, keeping the indexes in step."""
        old = machine.state
        machine.state = state
        if old is MachineState.ACTIVE and state is not MachineState.ACTIVE:
            self.drained.pop(machine.machine_id, None)
            if self.active_refs.get(machine.instance_ref) is machine:
                del self.active_refs[machine.instance_ref]
                self.hosts.machine_removed(machine)
            left = self.active_by_demand[machine.demand_id] - 1
            if left:
                self.active_by_demand[machine.demand_id] = left
            else:  # no zero entries: the keys would grow with every demand item ever served
                del self.active_by_demand[machine.demand_id]
            self.balance.counted(machine.demand_id, left)
        if old.live and not state.live:
            key = (machine.provider, machine.template_id)
            left = self.live_by_offer[key] - 1
            if left:
                self.live_by_offer[key] = left
            else:
                del self.live_by_offer[key]
            left = self.live_by_provider[machine.provider] - 1
            if left:
                self.live_by_provider[machine.provider] = left
            else:
                del self.live_by_provider[machine.provider]
            if self.prune:
                self._gone(machine)

    # --- pruning (``prune``): an ended lifecycle leaves the view ---------------------------------------------------

    def _gone(self, machine: MachineRecord) -> None:
        """``machine`` was returned or lost: end its lifecycle if that was the last of it."""
        record = None if machine.adopted else self.intents.get(machine.op_id)
        if record is None or machine.machine_id not in record.machine_ids:
            self._forget(machine)  # adopted, or a late machine of an op that ended: its lifecycle is its own
            return
        left = self._live_of_op[machine.op_id] - 1
        self._live_of_op[machine.op_id] = left
        if not left and not record.open:
            self._end_op(machine.op_id)

    def _end_op(self, op_id: str) -> None:
        """The request op ``op_id`` is closed and none of its machines is live: its intent and machines go."""
        record = self.intents.pop(op_id)
        self.open_ops.pop(op_id, None)
        self.broken_gangs.pop(op_id, None)
        self.on_completion.pop(op_id, None)
        self._live_of_op.pop(op_id, None)
        for machine_id in record.machine_ids:
            machine = self.machines.get(machine_id)
            if machine is not None and machine.op_id == op_id and not machine.adopted:
                self._forget(machine)

    def _forget(self, machine: MachineRecord) -> None:
        """Drop an ended machine with its orphan report, its host and every return left with no live machine."""
        if self.machines.get(machine.machine_id) is machine:
            del self.machines[machine.machine_id]
        self.reported_orphans.pop(machine.machine_id, None)
        ref = machine.instance_ref
        if ref and ref in self.hosts and ref not in self.active_refs:
            del self.hosts[ref]  # the controller drops the host of an ended machine too (it never rejoins)
        for op_id in self._returns_naming.pop(machine.machine_id, ()):
            left = self._return_left.get(op_id)
            if left is None:
                continue
            left.discard(machine.machine_id)
            if not left:
                del self._return_left[op_id]
                self.returns.pop(op_id, None)
                self.open_returns.pop(op_id, None)


def _shared_ref(record: IntentRecord | None, fact: InstanceFact) -> str:
    """The machine's instance_ref as the intent's own string object when it is the same text: a view of 100,000
    machines then holds each once, not twice (~8 MB). The i-th machine of an intent is looked for at i first; a
    small intent is searched, a large one is not (the fact's own string is kept)."""
    if record is not None:
        refs, i = record.intent.instance_refs, len(record.machine_ids)
        if i < len(refs) and refs[i] == fact.instance_ref:
            return refs[i]
        if len(refs) <= 64 and fact.instance_ref in refs:
            return refs[refs.index(fact.instance_ref)]
    return fact.instance_ref


def _spent(intent: RequestIntent) -> RequestIntent:
    """``intent`` without its join token hashes, once its op has closed (fulfilled or failed): each is read only to
    commit the instance fact of a machine the op makes (``steps.commit_instances``, with the op's own intent, or
    with the view's for an open op a restart recovers), and a closed op makes none. The controller keeps them for
    the joins; here they were 128 bytes a machine (12.8 MB at 100k live machines)."""
    return attrs.evolve(intent, token_hashes=()) if intent.token_hashes else intent


def fold(facts: Iterable[CommittedFact], view: FactView | None = None) -> FactView:
    """Fold ``facts`` (in log order) into ``view`` (a new one by default) and return it."""
    view = FactView() if view is None else view
    for committed in facts:
        view.apply(committed)
    return view
