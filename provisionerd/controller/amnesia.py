"""Is this controller the one we remember? The pure decision behind DESIGN invariant 9, no I/O.

A daemon remembers, per cluster, three things about the controller (``ControllerMemory``): the incarnation of its
fact log (``JoinReply.incarnation``: made when the log was created, never again), the highest fact index it
acknowledged to us (commit acks and resyncs), and the highest lease epoch it granted us per provider. A controller
that contradicts any of them forgot what it acknowledged (a lost or restored store, a controller started afresh),
and trusting it would undo the promises the daemon made on its word: its facts are the only record of the
machines we run, and an epoch granted twice fences nobody. So each check returns an ``Amnesia`` finding, and the
caller (``controller.amnesia_guard``) stops every mutation until an admin accepts the reset (``accept_reset``).

The rules, in the order they are checked:

``judge_join(memory, incarnation, last_index)``
    1. ``incarnation_changed``: we remember an incarnation and the controller names another one, or none (an empty
       incarnation is *unknown*, never "the same": a controller that told us its incarnation once and no longer
       does may be a new one). When we remember none (first contact, or only older controllers so far), any
       incarnation is accepted and remembered.
    2. ``last_index_behind``: the controller's last index is below the highest index it acknowledged to us. An
       older controller that does not send ``lastIndex`` reads as 0, so it passes only while we have acknowledged
       nothing (docs/protocol.md §4: a controller must send it).

``judge_grant(memory, provider, epoch, held_this_start)``
    3. ``epoch_regranted``: a new grant whose epoch is not above the highest we remember for that provider. The one
       exception is the epoch this very process start already held: the controller re-grants the same epoch to the
       same holder while its lease is still live (``controller.lease``), and nobody else held it in between. (So a
       controller restarted on an empty log that happens to grant exactly the epoch this process holds is caught
       by rules 1 and 2, not by this one; an older controller without an incarnation, before anything was
       acknowledged, is not caught at all: there is nothing it could have forgotten but that one epoch.)
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from provisionerd.domain.model import Epoch

INCARNATION_CHANGED = "incarnation_changed"
LAST_INDEX_BEHIND = "last_index_behind"
EPOCH_REGRANTED = "epoch_regranted"
REASONS = (INCARNATION_CHANGED, LAST_INDEX_BEHIND, EPOCH_REGRANTED)


def _frozen_epochs(value: Mapping[str, Epoch]) -> Mapping[str, Epoch]:
    return dict(sorted(value.items()))


@attrs.frozen
class ControllerMemory:
    """What the daemon remembers of one cluster's controller. The empty memory is "never joined"."""

    incarnation: str = ""
    last_index: int = 0
    epochs: Mapping[str, Epoch] = attrs.field(factory=dict, converter=_frozen_epochs)

    def __attrs_post_init__(self) -> None:
        if self.last_index < 0:
            raise ValueError(f"last_index must be >= 0, not {self.last_index!r}")


@attrs.frozen
class Amnesia:
    """One finding: ``reason`` (one of ``REASONS``), a sentence for people, and what the controller said (so an
    admin's ``accept_reset`` can remember exactly that)."""

    reason: str
    detail: str
    incarnation: str
    last_index: int
    provider: str = ""
    epoch: Epoch | None = None


def judge_join(memory: ControllerMemory, incarnation: str, last_index: int) -> Amnesia | None:
    """Whether a ``JoinReply`` with ``incarnation`` and ``last_index`` fits ``memory`` (``None``) or not."""
    if memory.incarnation and incarnation != memory.incarnation:
        said = repr(incarnation) if incarnation else "no incarnation (an older or another controller)"
        return Amnesia(
            INCARNATION_CHANGED,
            f"the controller's fact log is incarnation {said}, not {memory.incarnation!r}",
            incarnation,
            last_index,
        )
    if last_index < memory.last_index:
        return Amnesia(
            LAST_INDEX_BEHIND,
            f"the controller's last fact index is {last_index}, but it acknowledged index {memory.last_index}",
            incarnation,
            last_index,
        )
    return None


def judge_grant(memory: ControllerMemory, provider: str, epoch: Epoch, held_this_start: Epoch | None) -> Amnesia | None:
    """Whether a new grant of ``epoch`` for ``provider`` fits ``memory``; ``held_this_start``: the highest epoch
    this process start held for it (``LeaseKeeper.highest_epoch``)."""
    highest = memory.epochs.get(provider)
    if highest is None or epoch > highest or (epoch == highest and held_this_start == epoch):
        return None
    return Amnesia(
        EPOCH_REGRANTED,
        f"the controller granted {provider!r} epoch {epoch}, not above epoch {highest} it granted before",
        memory.incarnation,
        memory.last_index,
        provider=provider,
        epoch=epoch,
    )


def joined(memory: ControllerMemory, incarnation: str) -> ControllerMemory:
    """``memory`` after a join that passed ``judge_join``: the incarnation remembered if it was unknown."""
    if memory.incarnation or not incarnation:
        return memory
    return attrs.evolve(memory, incarnation=incarnation)


def acknowledged(memory: ControllerMemory, index: int) -> ControllerMemory:
    """``memory`` after the controller acknowledged fact ``index`` (it only grows)."""
    return memory if index <= memory.last_index else attrs.evolve(memory, last_index=index)


def granted(memory: ControllerMemory, provider: str, epoch: Epoch) -> ControllerMemory:
    """``memory`` after a grant that passed ``judge_grant`` (the highest epoch only grows)."""
    highest = memory.epochs.get(provider)
    if highest is not None and epoch <= highest:
        return memory
    return attrs.evolve(memory, epochs={**memory.epochs, provider: epoch})


def accept_reset(finding: Amnesia) -> ControllerMemory:
    """The memory an admin's decision leaves: the controller as it is now (its incarnation and last index), and no
    epochs (they belong to the forgotten log; the next grants are remembered afresh)."""
    return ControllerMemory(incarnation=finding.incarnation, last_index=finding.last_index)
