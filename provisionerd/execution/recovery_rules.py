"""What to do with a request op no task of this process runs (after a restart, a lost ack, an unknown outcome): one
pure function of what is known about the op at that moment (issue 31 item 2).

Its inputs, gathered by ``request_flow.RequestFlow.recover``:

- the op's intent: how many machines it asked for (``count``) and its instance refs;
- the controller's facts: the refs that already have an ``InstanceFact`` (``committed``);
- the plugin's own record of the call, where it keeps one (a legacy plugin's journal, after the adapter collected
  every call that ended while no daemon was there): ``RUNNING`` (a call an earlier process started still runs),
  ``UNKNOWN`` (it ended and nobody can tell what it did: killed at its deadline, its output lost), or ``KNOWN``
  (an answer, or a plugin that keeps no such record and answers a listing);
- the provider's listing by op tag: the refs of the machines it shows (``None``: not read, or the read failed).

The decision (``RecoveryStep``):

- ``WAIT``: the call still runs. Nothing is failed and nothing requested: its answer will say what it made.
- ``LIST``: list the op first (no listing read yet).
- ``FAIL_UNKNOWN``: a legacy call whose outcome is unknown: it cannot be listed, so ``RequestFailed`` says so and
  the orphan report names the op (never retried: a retry could make the machines twice).
- ``RETRY_LATER``: the listing failed: the intent stays open, recovery comes back.
- ``SETTLE``: commit an ``InstanceFact`` for every listed machine without one (``commit``); when fewer than
  ``count`` machines exist, ``RequestFailed`` for the rest (``shortfall``), which the planner requests as a new op
  with fresh tokens.

What it guarantees (``tests/reconcile/test_recovery_rules.py`` drives it with hypothesis over every step at which
a process can die): every machine the listing shows gets its fact before anything is failed; a running call is
never failed; an op whose machines all exist is never failed; an op is failed only for machines that do not exist
(or, legacy, that nobody can see).
"""

from __future__ import annotations

import enum
from collections.abc import Collection

import attrs


class CallRecord(enum.Enum):
    KNOWN = "known"  # answered, or no record kept (the listing tells)
    RUNNING = "running"  # a call an earlier process started still runs
    UNKNOWN = "unknown"  # ended, and what it did cannot be known (legacy: no listing either)


class Step(enum.Enum):
    WAIT = "wait"
    LIST = "list"
    FAIL_UNKNOWN = "fail_unknown"
    RETRY_LATER = "retry_later"
    SETTLE = "settle"


@attrs.frozen
class OpAtRestart:
    count: int
    refs: tuple[str, ...]
    committed: frozenset[str] = frozenset()
    call: CallRecord = CallRecord.KNOWN
    listing: tuple[str, ...] | None = None
    listed: bool = False  # a listing was attempted (``listing`` None then means it failed)


@attrs.frozen
class RecoveryStep:
    step: Step
    commit: tuple[str, ...] = ()  # refs whose machines get an InstanceFact now
    shortfall: int = 0  # machines asked for that do not exist: failed, to be requested as a new op

    @property
    def fails(self) -> bool:
        return self.step is Step.FAIL_UNKNOWN or (self.step is Step.SETTLE and self.shortfall > 0)


def recover_request(op: OpAtRestart) -> RecoveryStep:
    """The next step for ``op`` (see the module docstring)."""
    if op.call is CallRecord.RUNNING:
        return RecoveryStep(Step.WAIT)
    if op.call is CallRecord.UNKNOWN:
        return RecoveryStep(Step.FAIL_UNKNOWN, shortfall=op.count - len(op.committed & set(op.refs)))
    if not op.listed:
        return RecoveryStep(Step.LIST)
    if op.listing is None:
        return RecoveryStep(Step.RETRY_LATER)
    mine = set(op.refs)
    listed = [ref for ref in dict.fromkeys(op.listing) if ref in mine]
    commit = tuple(ref for ref in listed if ref not in op.committed)
    have = len((op.committed & mine) | set(listed))
    return RecoveryStep(Step.SETTLE, commit, max(0, op.count - have))


def unexplained(made: Collection[str], committed: Collection[str], step: RecoveryStep) -> set[str]:
    """The machines (refs) that exist and would be left without a fact once ``step`` is carried out."""
    return set(made) - set(committed) - set(step.commit)
