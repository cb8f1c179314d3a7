"""``mutation_while_halted`` judged on a recorder: only an intent acked before the loss, by a daemon that has not
learned of it, lets an amnesiac daemon mutate (``invariants.acked_before_loss``)."""

from __future__ import annotations

from provisionerd.domain.model import Epoch
from provisionerd.testing.simulation.invariants import check_mutation
from provisionerd.testing.simulation.observe import CallerLease, Commit, Mutation, Recorder

EPOCH = Epoch(1, 1)
LOSS = 34.562


def recorder(intent_at: float, *, learned: bool = False) -> Recorder:
    rec = Recorder(keep_trace=False)
    commit = Commit(intent_at, 8, "ReturnIntent", "sim", "op-3", EPOCH, "a#1", EPOCH, "a#1", None)
    rec.commits_by_op[("ReturnIntent", "op-3")].append(commit)
    rec.amnesiac["a#1"] = LOSS
    if learned:
        rec.learned.add("a#1")
    return rec


def mutate(rec: Recorder, epoch: Epoch = EPOCH) -> set[str]:
    caller = CallerLease("a#1", "daemon-a", True, epoch, LOSS + 5)
    check_mutation(rec, Mutation(LOSS + 0.04, "sim", "requestReturnMachines", "op-3", caller))
    return {v.invariant for v in rec.violations}


def test_an_intent_acked_before_the_loss_may_be_acted_on_until_the_daemon_learns():
    assert "mutation_while_halted" not in mutate(recorder(33.97))


def test_once_the_daemon_has_learned_it_is_halted_whatever_it_was_acked():
    assert "mutation_while_halted" in mutate(recorder(33.97, learned=True))


def test_an_intent_acked_after_the_loss_does_not_excuse_the_mutation():
    assert "mutation_while_halted" in mutate(recorder(LOSS + 0.01))


def test_an_intent_of_another_epoch_does_not_excuse_the_mutation():
    assert "mutation_while_halted" in mutate(recorder(33.97), Epoch(1, 2))
