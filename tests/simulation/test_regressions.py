"""Seeds the campaign found failing, one test each (see docs/simulation.md, "Turning a failing seed into a
regression test").

The bugs below were in code being written while the harness landed (the provisioning lifecycle); each test was a
strict xfail naming the bug until it was fixed; a new finding starts the same way (it fails with XPASS the moment
the bug is fixed: then remove its mark and keep it as the regression test).
"""

from __future__ import annotations

import json

import pytest

from provisionerd.testing.simulation import World, run_seed, run_world
from provisionerd.testing.simulation.faults import WEIGHTED


def violated(seed: int) -> set[str]:
    # The seeds were found before the ``twin`` fault existed: replay them as found (twins have test_twin.py).
    result = run_seed(seed, fault_kinds=WEIGHTED)
    return {v.invariant for v in result.violations}


def violated_now(seed: int) -> set[str]:
    """Every fault kind, as the campaign draws them today (the seeds found since the last kind was added)."""
    return {v.invariant for v in run_seed(seed).violations}


def test_seed_44_a_resumed_return_carries_the_current_epoch():
    """Was: a return resumed after a failover called requestReturnMachines with only the older epoch's
    ReturnIntent committed. Fixed: every return call (first, retry, resumed) passes the gate as it starts."""
    assert "mutation_without_intent" not in violated(44)


def test_seed_270_a_retried_request_passes_the_gate():
    """Was: executor._after_request_error retried requestMachines outside the gate with an epoch read before a
    sleep (retry under 3.1, intent under 1.1). Fixed: each retry passes the gate, re-committing the intent under
    the epoch held when the retry starts."""
    assert "mutation_without_intent" not in violated(270)


def test_seed_84_no_second_creation_on_a_cloud_without_client_tokens():
    """Was: after an unknown outcome the executor retried the same op_id although the listing showed its machines
    and the cloud has no idempotency. Fixed: a complete listing settles the op; a provider that does not declare
    features.idempotentRequest is never re-called with the same op_id (the shortfall becomes a new op)."""
    assert "op_created_twice" not in violated(84)


def test_seed_281_a_lost_snapshot_after_a_join_is_recovered():
    """Found by the campaign (kill, partitions, failovers, then drop_pushes@159): the demand snapshot pushed after a
    (re)join was lost and nothing asked again, so the lease holder never planned. Fixed in ``session_link``: a
    link without a snapshot after a resync resyncs again with backoff (and every ``refresh_heartbeats``)."""
    assert "no_convergence" not in violated(281)


def plans_before_a_resync_after_the_grant(trace: list[str]) -> list[str]:
    """Trace lines of actions a daemon planned after a lease grant and before a resync that followed it (the
    join's, or one the grant requested). The simulation has one provider, so any grant counts."""
    waiting: set[str] = set()
    bad = []
    for line in trace:
        _at, who, what, fields = line.split(" ", 3)
        if what == "lease_acquired":
            waiting.add(who)
        elif what == "resync" or (what == "refresh" and json.loads(fields)["reason"] == "requested"):
            waiting.discard(who)
        elif what == "action" and who in waiting and json.loads(fields).get("phase") == "planned":
            bad.append(line)
    return bad


def test_seed_257_a_new_lease_holder_plans_from_current_facts():
    """Found by the campaign (b partitioned c2s, a returns its machines, quorum loss, b takes the lease over): b
    planned from its last resync, with a's returned machines still active, and requested 1 of 4. Fixed: every
    lease acquisition registers a resync (``session.resync_after_grant``) and the loop plans a provider only from
    a view resynced after its grant (``session.synced_for``). The periodic refresh alone would also converge this
    seed later, so the test checks the rule itself in the trace too."""
    world = World(257, keep_trace=True, fault_kinds=WEIGHTED)
    result = run_world(world)
    assert "no_convergence" not in {v.invariant for v in result.violations}, result.violations
    assert plans_before_a_resync_after_the_grant(world.recorder.trace) == []


def test_seed_293_a_refused_intent_is_not_replanned_in_a_busy_loop():
    """Was: during a quorum loss every ReturnIntent was refused no_quorum and replanned at once under a new op_id
    at one virtual instant. Fixed: a no_quorum/not_primary/link refusal backs the loop off (IntentRefused)."""
    result = run_seed(293, wall_budget=3.0, fault_kinds=WEIGHTED)
    assert "stuck" not in {v.invariant for v in result.violations}


def test_seed_4137_a_vanished_machine_is_not_made_again_under_its_op_id():
    """Found by the 10,000-seed campaign (gate workload, cloud without client tokens; provider_fault garbage@104.963
    then vanish@152.196): requestMachines for prov-b.9a67c1.5 made m-23 but answered garbage, m-23 vanished, the
    stand-in driver's listing by op tag came back empty (terminated machines are not listed) and it retried the
    same op_id, which made m-25. Fixed in ``driver.py``: on a cloud that does not declare idempotentRequest an
    unknown outcome is settled from the listing and never retried under the same op_id (as the executor does)."""
    result = run_seed(4137, fault_kinds=WEIGHTED)
    assert result.ok, result.violations


def test_seed_5366_an_op_whose_machine_vanished_during_a_hang_is_not_retried():
    """Found by the 10,000-seed campaign (gate workload, no client tokens; provider_fault hang@38.783, then
    vanish@43.109 took m-2 of prov-a.5ff09c.1 while its call still hung): the empty listing led the driver to
    retry the same op_id, making m-4. Same fix as seed 4137."""
    result = run_seed(5366, fault_kinds=WEIGHTED)
    assert result.ok, result.violations


def test_seed_3550_machines_listed_before_a_retry_are_recorded():
    """Found by the campaign (lifecycle; provider hangs, then garbage): requestMachines timed out, the recovery
    listing showed 4 of 5 machines, the same op_id was retried, and every later poll and listing failed, so the op
    timed out with none recorded: 4 joined machines stayed unattributed (the orphan breaker, 4 of 7 suspects, kept
    them), surplus forever. Fixed in ``executor_unknown``: what a listing shows is committed before the retry."""
    assert "no_convergence" not in violated(3550)


def test_seed_5406_an_op_is_listed_before_it_is_failed():
    """Found by the campaign (lifecycle; a hung requestMachines made 7 machines, quorum loss, partitions): the
    recovery listing failed and the planner failed the op (provisioning_timeout) without listing it, so its 7
    machines never got a fact and were never returned. Fixed: ``ReconcileLoop`` lists the op and records its
    machines (``Executor.attribute_op``) before committing RequestFailed."""
    assert "no_convergence" not in violated(5406)


def test_seed_7001_two_daemons_never_trust_a_lease_at_once():
    """Found by the 10,000-seed campaign (lifecycle workload): the lease safety property, two valid holders. Daemon a
    was granted 2.1 but lost the primary before committing a fact; the new primary's grace re-granted the writer of
    the latest fact (b) at once. It now re-grants only the last grantee, recorded durably at each grant."""
    assert "two_lease_holders" not in violated(7001)


def test_seed_474_a_daemon_takes_the_lease_again_after_accepting_a_controller_reset():
    """Found by the campaign once it drew ``store_loss`` (lifecycle; kills, partitions, then the controller back on
    an empty store): the daemon halted, the admin accepted the reset, and its lease keeper refused the new
    controller's epoch 1.1 forever as "below" the 1.2 it had held this start (``epoch_went_backwards``), so demand
    was never met again. Fixed: an amnesia halt also forgets the epochs the keeper held (``builder._halt_keeper``).
    Seed 235 was the same."""
    assert "no_convergence" not in violated(474)
    assert "no_convergence" not in violated(235)


def test_seeds_910014_and_others_a_released_lease_is_not_trusted_while_the_release_is_on_its_way():
    """Found by a 1,500-seed campaign from 910000 (issue 31): ``two_lease_holders`` at a twin's clean stop. The
    keeper stops trusting before it sends LeaseRelease, but the observer closed the belief only on
    ``lease_released`` (after the answer), by which time the controller had granted the next epoch. The keeper now
    says ``lease_releasing`` when trust ends and the observer reads that."""
    for seed in (910014, 910099, 910120, 910141, 910280, 910662):
        assert "two_lease_holders" not in violated_now(seed), seed


def test_seed_910462_reported_orphans_do_not_hold_the_breaker_open_for_a_vanished_machine():
    """Found by the same campaign: after a store loss four machines without facts were reported, yet counted as
    breaker suspects for good, so a machine that vanished was never retired and counted as supply (demand 5, 4
    running). A machine already reported is explained by its OrphanReported fact (``orphans.gates``)."""
    assert "no_convergence" not in violated_now(910462)


@pytest.mark.sweep
def test_seeds_where_a_joined_machine_looked_never_joined():
    """Found once the ``controller_restart`` fault and the ``joined_retired_as_never_joined`` invariant existed:
    434 and 272546475 (the daemon killed while the controller restarted: the machines it had seen joined must
    survive its restart, ``joined.<cluster>.txt``), 272546760 (the push of a join lost; the digest missed it: the
    hosts are confirmed by a resync before a retirement for not joining), 272546828 (a worker joined before its
    instance fact was committed: the set keeps refs an open intent names), 272546517 (a machine adopted after a
    store loss: the set is not pruned to an emptied view) and 272546480 (a join seen by nobody while the daemon
    was cut off: a machine launched before the rejoin waits the whole window), 779519691 (such a join stalled on its
    way, the machine vanished, the controller restarted: after the window it is returned as no_host)."""
    for seed in (434, 272546475, 272546760, 272546828, 272546517, 272546480, 272546408, 272547007, 779519691):
        assert "joined_retired_as_never_joined" not in violated_now(seed), seed


def test_seed_77138038_an_ack_in_flight_at_a_store_loss_is_not_a_halted_mutation():
    """Found by CI's random start 77137942: a ``ReturnIntent`` acked at 33.97, the store lost at 34.562, the ack
    delivered 0.635 s later (an s2c delay) and the return called at once. The daemon held a valid lease and an
    acknowledged intent and could not know of the loss; the invariant was wrong, not the daemon
    (``invariants.acked_before_loss``), and so was ``machine_forgotten`` for the machine that return named."""
    found = violated_now(77138038)
    assert "mutation_while_halted" not in found
    assert "machine_forgotten" not in found


def test_seeds_1022_and_1120_an_op_answered_with_a_foreign_id_is_settled_by_its_listing(monkeypatch):
    """The ``foreign_id`` fault (issue 31 finding 3): the cloud makes the machines and answers a requestId it never
    made. Read as "nothing made" (``foreign_request`` patched out: the daemon as it was), the ops were failed with
    their machines unexplained, 3 and 10 times; now the listing by op tag explains them first."""
    for seed in (1022, 1120):
        assert "failed_with_machines" not in violated_now(seed), seed
    monkeypatch.setattr("provisionerd.execution.steps.foreign_request", lambda statuses, request_id, answered_by: None)
    assert "failed_with_machines" in violated_now(1022)


def test_seed_9_a_daemon_killed_mid_call_finds_what_the_call_made(monkeypatch):
    """The ``kill_mid_call`` fault (issue 31 item 7): the daemon dies as its mutation starts and the cloud completes
    the call. The restarted daemon's recovery lists the op and explains its machines before it fails the rest;
    with listings that show nothing (patched: the recovery as if it could not see) ``failed_with_machines`` says so."""
    result = run_seed(9)
    assert result.counts.get("killed_mid_call") and not result.counts.get("foreign_id") and not result.violations

    async def blind(self, provider, op_id):
        return ()

    monkeypatch.setattr("provisionerd.execution.steps.Steps.list_op", blind)
    assert "failed_with_machines" in violated_now(9)


def test_seeds_665670412_and_665672842_a_deadline_fail_waits_for_a_listing(monkeypatch):
    """The planner's fail at the provisioning deadline lists the op first; the listing failed (a provider fault at
    that moment) and the fail went ahead, leaving machines the call made later with no fact (the 2 of 5,000 seeds
    from 665668386; ``failed_with_machines`` did not judge that fail then). Now a fail whose listing keeps failing
    is handed back and planned again, and the invariant judges every fail.

    The old behaviour (the monkeypatch below) is seen in seed 1243 of a world with only provider faults, slow calls
    and machines that never join (the first of 1,500 such seeds). The campaign's worlds met it too rarely to keep one
    pinned: seed 665669708 showed it until the reclaim poll read the provider's features (``reclaimsByTags``), one
    call more that moved every later draw, and none of 6,000 seeds from 665668386 showed it after that."""
    for seed in (665670412, 665672842, 665669708):
        assert "failed_with_machines" not in violated_now(seed), seed
    assert "failed_with_machines" not in focused(1243)

    async def as_before(self, record, op_id):
        view = self._view
        intent = view.facts.intents.get(op_id) if view is not None else None
        if intent is not None:
            await self._executor.attribute_op(intent.intent)
        return True  # the fail goes ahead whatever the listing said

    monkeypatch.setattr("provisionerd.execution.operations.Operations._attribute", as_before)
    assert "failed_with_machines" in focused(1243)


def focused(seed: int) -> set[str]:
    """A world whose only faults fail or slow the provider's calls and keep machines from joining."""
    kinds = ("provider_fault", "no_join", "provider_slow")
    return {v.invariant for v in run_seed(seed, fault_kinds=kinds).violations}


def test_seed_918275638_an_unhealthy_provider_is_probed_within_the_settle_time():
    """Not the daemon's: the simulation's policy kept the production ``unhealthy_max`` (1800 s) while every other
    time was scaled down, so a fourth ``quota_exceeded`` put the next probe 240 s later, past the 200 s the run
    settles after its last fault (``no_convergence``: 4 machines of 7). The simulated ``unhealthy_max`` is 60 s."""
    assert "no_convergence" not in violated_now(918275638)


def test_seed_734516497_an_adopted_machine_is_never_returned_as_never_joined():
    """A machine that joined under the controller's lost incarnation was adopted after the reset; its worker cannot
    join the new incarnation, and the daemon returned it as ``never_joined`` (its adoption fact has no launch time,
    so it counted from its adoption). It goes as ``no_host``: nothing of its life before the adoption was seen."""
    assert "joined_retired_as_never_joined" not in violated_now(734516497)


def test_seeds_470068547_and_470070180_a_halt_is_not_waited_out_by_an_instance_fact():
    """Was (this session's noLease retry): an instance fact refused while every mutation was halted (store loss)
    waited for the lease and was committed to the reset controller, and the machines never matched demand. Fixed:
    a lease not valid because of a halt raises ``MutationsHalted``, which no commit waits out."""
    for seed in (470068547, 470070180):
        assert "no_convergence" not in violated_now(seed), seed


def test_seed_470068049_machines_a_lost_request_makes_again_after_the_reset_are_the_daemons():
    """Was (the invariant): the daemon ran a request the lost log held again after the reset, under the same op_id,
    and recorded its machines in the new log; the convergence check counted them as explained by the lost log (the
    admin's) and saw 4 of 8. A machine the current log records is the daemon's."""
    assert "no_convergence" not in violated_now(470068049)


def test_seed_859785291_a_retry_refused_after_an_unknown_outcome_does_not_fail_the_op():
    """Was: the retry of a request whose first call's outcome was unknown (its listing unreadable) was refused, and
    the op was failed as "nothing made" while the first call's machines ran with no fact. Fixed: the op stays open
    for recovery's listing."""
    assert "failed_with_machines" not in violated_now(859785291)


def test_seed_616600159_a_legacy_return_names_its_machine_for_the_notice_check():
    """Was (the harness): in a legacy LSF world the daemon returned the noticed machine 6 s after the notice, but the
    simulated LSF plugin did not tell the cloud which machines its returns named, so ``notice_ignored`` judged the
    machine unreturned (found by a 10,000-seed campaign from 616599404). Both call paths now note the
    machines a return names (``SimCloud.note_named``)."""
    assert "notice_ignored" not in violated_now(616600159)


def test_seed_27300695_a_machine_an_orphan_report_names_waits_out_its_grace():
    """Was (the convergence check): a daemon killed mid-call on a cloud without client tokens; its call made 2
    machines 4 s after the restarted daemon's recovery listed the op empty and failed it. They never joined (a
    ``no_join`` window), the orphan cycle reported them at once (``tagged_unknown``, returned after the 1800 s orphan
    grace), and the convergence check, 200 s after the last fault, counted them as the daemon's. A machine a
    committed orphan report names is explained, in the convergence check as in the final one."""
    assert "no_convergence" not in violated_now(27300695)


def test_seed_859789075_a_grant_sent_before_a_store_loss_belongs_to_the_old_era():
    """Was (the invariant): a grant of 1.2 the lost controller sent before its store loss reached the daemon 2.6 s
    after it, and was held until the amnesia was seen; filed by time in the new era, it read as 1.1 after 1.2."""
    assert "epoch_regressed" not in violated_now(859789075)


def test_seed_859784707_a_vanished_machine_the_cloud_reports_ended_is_replaced_at_once():
    """Was (the simulated cloud): every vanished machine vanished silently, found only by the orphan cycle's
    listings; one that vanished late, after a store loss had opened the orphan breaker, was replaced only as a
    confirmed ghost at 376 s, past the settle window. A real cloud's plugin reports a terminated instance in
    getReturnRequests (gracePeriod 0): the simulated one now does for every other machine (the rest stay ghosts),
    and the daemon replaces it at once as lost."""
    assert "no_convergence" not in violated_now(859784707)


def test_seed_932997547_a_commit_that_landed_after_its_link_broke_reaches_the_view():
    """Was (a 10,000-seed campaign from 932987747, a legacy world): an instance fact sent on a link that a 9 s
    delay broke landed 30 ms after the new link's first resync; the controller pushes no facts and the digest
    compares only the last index, which the daemon's later commits reached, so the daemon never saw it and the
    machine ran on past demand. Fixed: a commit that ends in LinkDown marks a doubt (``controller.commit_doubt``),
    and a link whose last resync began before its time resyncs once more."""
    result = run_seed(932997547, legacy_share=0.3)
    assert "no_convergence" not in {v.invariant for v in result.violations}


def test_seed_4438_an_answer_no_float_holds_is_refused_not_a_crash(monkeypatch):
    """A ``garbage`` window's poll or listing that names machines answers them with a ``launchtime`` of 400
    digits: an integer >= 0, as the schema says, that no float holds. The readers' ``float()`` raised
    ``OverflowError``, which they did not turn into ``ProviderAnswerInvalid``: the daemon crashed (10 of the 200
    seeds from 4242, seed 4438 the first). Now the answer is refused like any other the daemon cannot read."""
    assert "daemon_crashed" not in violated_now(4438)
    monkeypatch.setattr(
        "provisionerd.provider.contract._UNREADABLE", (KeyError, TypeError, ValueError, IndexError, AttributeError)
    )
    assert "daemon_crashed" in violated_now(4438)
