"""What one simulated run saw: the trace (for reproducibility) and the observations the invariants read.

The world feeds the ``Recorder`` as things happen (a lease grant on the controller, a fact appended to its log, a
daemon coming to believe it holds a lease, a provider call starting, machines being created). Continuous checks
(``invariants.py``) run on each observation as it is recorded, so a violation is stamped with the virtual time it
happened; the final checks run once at the end.

The trace is one line per observation and per daemon event, with trio's clock (never the wall clock): two runs of
the same seed give the same lines, so ``digest`` identifies a run.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Callable
from typing import Any

import attrs
import trio

from provisionerd.domain.model import Epoch


@attrs.frozen
class Violation:
    at: float
    invariant: str
    detail: str


@attrs.frozen
class CallerLease:
    """The calling daemon's lease on the provider at the instant a provider call started."""

    instance: str  # daemon instance, e.g. "a#2" (slot a, second start)
    identity: str
    valid: bool  # keeper.valid(now)
    epoch: Epoch | None
    valid_until: float


@attrs.frozen
class Mutation:
    at: float
    provider: str
    action: str
    op_id: str
    caller: CallerLease


@attrs.frozen
class Creation:
    at: float
    provider: str
    op_id: str
    machine_ids: tuple[str, ...]
    instance_refs: tuple[str, ...]
    caller: str


@attrs.frozen
class Commit:
    """A fact the controller appended (not a duplicate acknowledged again)."""

    at: float
    index: int
    kind: str
    provider: str
    op_id: str
    epoch: Epoch
    sender: str
    lease_epoch: Epoch | None  # the provider's live lease on the controller at that instant
    lease_holder: str | None
    fact: Any = attrs.field(eq=False, repr=False)


@attrs.define
class Belief:
    """A daemon instance believing it holds ``epoch`` of ``provider``: from ``start`` until ``end`` (its local
    deadline, moved by renewals, or earlier when it lapsed or the daemon was killed)."""

    instance: str
    provider: str
    epoch: Epoch
    start: float
    end: float
    closed: bool = False


class Recorder:
    def __init__(self, *, keep_trace: bool = True) -> None:
        self.keep_trace = keep_trace
        self.trace: list[str] = []
        self._hash = hashlib.sha256()
        self.violations: list[Violation] = []
        self.commits: list[Commit] = []
        self.last_fact: dict[str, Commit] = {}
        self.commits_by_op: dict[tuple[str, str], list[Commit]] = collections.defaultdict(list)
        self.grants: dict[tuple[str, Epoch], float] = {}  # (provider, epoch) -> first grant time
        #: Ops of a legacy world whose plugin acted in a call whose answer was then lost (``lsf.py``).
        self.lost_legacy_answers: set[str] = set()
        self.last_new_epoch: dict[str, Epoch] = {}
        self.beliefs: list[Belief] = []
        self.open_beliefs: dict[tuple[str, str], Belief] = {}
        #: Finished controller eras (a store loss starts a new one: its epochs start again at term 1): each era's
        #: ``grants`` and ``beliefs``, judged apart by ``invariants.check_lease_history``.
        self.past_eras: list[tuple[dict[tuple[str, Epoch], float], list[Belief]]] = []
        #: Daemon instances that remember a controller incarnation that was lost and whose reset no admin has
        #: accepted yet (instance -> since when): none of them may start a provider mutation
        #: (``mutation_while_halted``), except one whose intent the old controller acknowledged before the loss and
        #: that it started before it learned of the loss (the ack was in flight: it cannot know).
        self.amnesiac: dict[str, float] = {}
        #: The amnesiac instances that have reported the amnesia (a ``controller_amnesia`` event): they know.
        self.learned: set[str] = set()
        #: Request ops the cloud answered with a requestId it never made, not failed yet (``failed_with_machines``).
        self.unknown_ops: set[str] = set()
        #: Machines gone behind the daemons' backs (``vanish``): no listing shows them.
        self.gone: set[str] = set()
        self.mutations: list[Mutation] = []
        self.creations: dict[str, list[Creation]] = collections.defaultdict(list)
        self.counts: collections.Counter[str] = collections.Counter()
        #: Called with every provider mutation after the continuous checks (a fault's own watch: ``reload``).
        self.on_mutation: list[Callable[[Mutation], None]] = []

    # --- the trace -------------------------------------------------------------------------------------------------

    def note(self, who: str, what: str, **fields: Any) -> None:
        self.counts[what] += 1
        line = f"{_now():.6f} {who} {what} {json.dumps(fields, default=str, sort_keys=True)}"
        self._hash.update(line.encode())
        if self.keep_trace:
            self.trace.append(line)

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def violate(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(_now(), invariant, detail))
        self.note("check", "violation", invariant=invariant, detail=detail)

    @property
    def first(self) -> Violation | None:
        return min(self.violations, key=lambda v: v.at) if self.violations else None

    # --- observations (the continuous checks run from here) --------------------------------------------------------

    def foreign_answer(self, op_id: str) -> None:
        """The cloud answered ``op_id``'s request with a requestId it never made (a store loss forgets the op)."""
        self.unknown_ops.add(op_id)
        self.note("provider", "foreign_id", op_id=op_id)

    def new_controller(self, incarnation: str) -> None:
        """The controller came back on an empty store (``store_loss``): a new era of epochs and facts. Beliefs
        still open stay checked against every other by ``check_single_holder``."""
        self.past_eras.append((self.grants, self.beliefs))
        self.grants, self.beliefs = {}, []
        self.last_new_epoch.clear()
        self.last_fact.clear()
        self.unknown_ops.clear()
        self.note("controller", "new_incarnation", incarnation=incarnation)

    def amnesia(self, instance: str, halted: bool) -> None:
        """``instance`` must be halted (it remembers a lost incarnation) or no longer (the admin accepted)."""
        if halted:
            self.amnesiac.setdefault(instance, _now())
        else:
            self.amnesiac.pop(instance, None)
            self.learned.discard(instance)
        self.note("check", "must_halt" if halted else "may_resume", instance=instance)

    def grant(self, provider: str, holder: str, epoch: Epoch, renewal: bool) -> None:
        """A lease grant on the controller; ``renewal`` is false only for a newly numbered epoch."""
        from provisionerd.testing.simulation import invariants

        key = (provider, epoch)
        if not renewal:  # a fresh grant must carry an epoch above every earlier one (unique and growing)
            invariants.check_new_epoch(self, provider, epoch)
            self.last_new_epoch[provider] = max(epoch, self.last_new_epoch.get(provider, epoch))
        self.grants.setdefault(key, _now())
        self.note("controller", "lease_grant", provider=provider, holder=holder, epoch=str(epoch), renewal=renewal)

    def commit(self, commit: Commit) -> None:
        from provisionerd.testing.simulation import invariants

        self.commits.append(commit)
        self.commits_by_op[(commit.kind, commit.op_id)].append(commit)
        self.note(
            "controller",
            "fact",
            index=commit.index,
            kind=commit.kind,
            op_id=commit.op_id,
            epoch=str(commit.epoch),
            sender=commit.sender,
        )
        invariants.check_commit(self, commit)

    def hold(self, instance: str, provider: str, epoch: Epoch, valid_until: float) -> None:
        """The instance's keeper (re)started trusting ``epoch`` until ``valid_until``."""
        from provisionerd.testing.simulation import invariants

        now = _now()
        belief = self.open_beliefs.get((instance, provider))
        if belief is not None and belief.epoch == epoch and not belief.closed:
            belief.end = valid_until
        else:
            if belief is not None:
                self.release(instance, provider)
            belief = Belief(instance, provider, epoch, now, valid_until)
            self._era_of(provider, epoch).append(belief)
            self.open_beliefs[(instance, provider)] = belief
        invariants.check_single_holder(self, belief)

    def _era_of(self, provider: str, epoch: Epoch) -> list[Belief]:
        """The beliefs of the era whose controller granted ``epoch``: the current one, unless only an earlier
        incarnation granted it (its grant, sent before a store loss, reached the daemon after it; seed 859789075)."""
        if (provider, epoch) not in self.grants:
            for grants, beliefs in reversed(self.past_eras):
                if (provider, epoch) in grants:
                    return beliefs
        return self.beliefs

    def release(self, instance: str, provider: str | None = None) -> None:
        """The instance stopped trusting its lease(s) now (lapse, kill)."""
        now = _now()
        for (inst, prov), belief in list(self.open_beliefs.items()):
            if inst == instance and (provider is None or prov == provider):
                belief.end = min(belief.end, now)
                belief.closed = True
                del self.open_beliefs[(inst, prov)]

    def mutation(self, mutation: Mutation) -> None:
        from provisionerd.testing.simulation import invariants

        self.mutations.append(mutation)
        c = mutation.caller
        self.note(
            "provider",
            "mutation",
            action=mutation.action,
            op_id=mutation.op_id,
            caller=c.instance,
            valid=c.valid,
            epoch=str(c.epoch),
        )
        invariants.check_mutation(self, mutation)
        for watch in self.on_mutation:
            watch(mutation)

    def creation(self, creation: Creation) -> None:
        from provisionerd.testing.simulation import invariants

        self.creations[creation.op_id].append(creation)
        self.note(
            "provider", "created", op_id=creation.op_id, machines=list(creation.machine_ids), caller=creation.caller
        )
        invariants.check_creation(self, creation)


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:
        return float("nan")


def describe_exception(exc: BaseException) -> str:
    """One line for a daemon task that died: each exception with the last frame it passed."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_exception(e) for e in exc.exceptions)
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        where = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 2)[-1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc} at {where}"
