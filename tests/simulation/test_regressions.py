"""Seeds the campaign found failing, one test each (see docs/simulation.md, "Turning a failing seed into a
regression test").

The bugs below are in code being written while the harness landed (the provisioning lifecycle); each test is a
strict xfail naming the bug, so the suite stays green now and the test fails (XPASS) the moment the bug is fixed:
then remove its mark and keep it as the regression test.
"""

from __future__ import annotations

import pytest

from provisionerd.simulation import run_seed


def violated(seed: int) -> set[str]:
    result = run_seed(seed)
    return {v.invariant for v in result.violations}


@pytest.mark.xfail(strict=True, reason=(
    "executor: a return resumed under a new epoch (after a failover) calls requestReturnMachines with only the "
    "ReturnIntent of the older epoch committed; invariant 1 wants an intent carrying the current epoch"))
def test_seed_44_a_resumed_return_carries_the_current_epoch():
    assert "mutation_without_intent" not in violated(44)


@pytest.mark.xfail(strict=True, reason=(
    "executor._after_request_error: retries requestMachines outside the gate, with the epoch read before a "
    "sleep; after a failover the retry runs under epoch 3.1 while the intent carries 1.1 (and a lease that "
    "lapsed during the sleep would not stop it)"))
def test_seed_270_a_retried_request_passes_the_gate():
    assert "mutation_without_intent" not in violated(270)


@pytest.mark.xfail(strict=True, reason=(
    "executor: after an unknown outcome it retries requestMachines with the same op_id even when the listing "
    "already shows that op's machines and the provider does not declare idempotentRequest: machines twice"))
def test_seed_84_no_second_creation_on_a_cloud_without_client_tokens():
    assert "op_created_twice" not in violated(84)


@pytest.mark.xfail(strict=True, reason=(
    "liveness: the demand snapshot pushed after a (re)join was lost (drop_pushes); the view stays incomplete "
    "and nothing asks for a snapshot again while the demand does not change, so the lease holder never plans"))
def test_seed_281_a_lost_snapshot_after_a_join_is_recovered():
    assert "no_convergence" not in violated(281)


@pytest.mark.xfail(strict=True, reason=(
    "a standby's view keeps the facts of its last resync: after it takes the lease over it plans with the "
    "other daemon's machines as still active (their Returned facts came later), so it requests 1 of 4"))
def test_seed_257_a_new_lease_holder_plans_from_current_facts():
    assert "no_convergence" not in violated(257)


@pytest.mark.xfail(strict=True, reason=(
    "livelock: during a quorum loss the gate refuses every ReturnIntent (no_quorum), the loop drops the action "
    "and replans it at once under a fresh op_id, forever, at one virtual instant (thousands of op_ids burned)"))
def test_seed_293_a_refused_intent_is_not_replanned_in_a_busy_loop():
    result = run_seed(293, wall_budget=3.0)
    assert "stuck" not in {v.invariant for v in result.violations}
