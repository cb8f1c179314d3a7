"""Legacy worlds (issue 31 item 7, "a daemon kill at every step of a slow one-shot call, legacy mode included"):
the production legacy adapter, its journal and its attribution rule over the simulated LSF plugin
(``provisionerd.testing.simulation.lsf``), in the campaign at ``LEGACY_CHANCE`` (``simulate --legacy-share``). The
seeds below failed when they came; each test names what it showed and what fixed it."""

from __future__ import annotations

from provisionerd.testing.simulation import World, run_world
from provisionerd.testing.simulation.faults import LEGACY_CHANCE


def legacy_world(seed: int) -> World:
    world = World(seed, keep_trace=True, legacy_share=LEGACY_CHANCE)
    assert world.settings.legacy, f"seed {seed} no longer draws a legacy world"
    return world


def test_a_daemon_killed_mid_call_collects_the_answer_its_plugin_gave_meanwhile():
    """Seed 48: the daemon is killed as its first requestMachines starts; the plugin's call runs on, makes its
    machine and answers while no daemon is there. The next start collects that answer (not an unknown outcome),
    polls it, and its machine gets its instance fact; the world converges with no violation."""
    world = legacy_world(48)
    result = run_world(world)
    assert not result.violations
    trace = "\n".join(world.recorder.trace)
    assert "killed_mid_call" in trace
    killed_op = next(line for line in world.recorder.trace if "killed_mid_call" in line).split('"op_id": "')[1][:-2]
    made = [c for c in world.recorder.creations[killed_op]]
    assert made and all(c.caller == "a#1" for c in made), "the dead daemon's call made its machine after the kill"
    facts = {c.fact.machine_id for c in world.recorder.commits if c.kind == "InstanceFact"}
    assert {m for c in made for m in c.machine_ids} <= facts


def test_legacy_worlds_are_drawn_after_everything_else():
    """The same seed without legacy worlds draws the same settings but ``legacy``, the same faults and demand."""
    plain, legacy = World(48, keep_trace=False), legacy_world(48)
    assert not plain.settings.legacy
    assert plain.plan == legacy.plan and plain.demand == legacy.demand
    # ... and 100 s more to settle (a per-machine op may wait for a call hung up to its 180 s timeout)
    expected = {
        **vars_of(legacy.settings),
        "legacy": False,
        "legacy_share": 0.0,
        "settle": legacy.settings.settle - 100,
    }
    assert plain.settings == legacy.settings.__class__(**expected)


def vars_of(settings: object) -> dict[str, object]:
    import attrs

    return attrs.asdict(settings, recurse=False)


def violated(seed: int) -> set[str]:
    return {v.invariant for v in run_world(legacy_world(seed)).violations}


def test_seed_270_an_op_whose_last_per_machine_call_hung_lists_what_its_answered_calls_made():
    """Was: a per-machine op's first call answered, its second hung past the provisioning deadline; the op was
    judged timed out unpolled, and its listing was refused for the unknown call, so the first machine ran with no
    fact (``failed_with_machines``, ``unexplained_machine``). Fixed: the adapter lists what an op's answered calls
    made even when another call's outcome is unknown, and a call answering after the deadline is read once."""
    assert not violated(270)


def test_seed_1378_a_refused_call_collected_after_a_kill_settles_its_op():
    """Found while fixing seed 270: an op whose only call was refused while its daemon was dead was never listed
    again (no call answered), so recovery found nothing forever and the demand went unmet. An op with nothing
    answered is refused a listing only when one of its calls has an unknown outcome."""
    assert not violated(1378)


def test_seed_1342_a_lost_call_not_told_apart_from_another_is_reported_not_guessed():
    """Two overlapping hung calls of the same shape, one request in the plugin's record: nothing is guessed, the op
    fails as an unknown outcome, and the orphan report names the machine from the plugin's record (the final check
    reads the live daemon's ``unknown_outcomes()``); it is no longer counted as demand served."""
    assert not violated(1342)


def test_seed_1708_no_per_machine_call_after_the_lease_that_admitted_the_op_is_gone():
    """A failover renumbered the holder's lease between two per-machine calls of one admitted op, and the second ran
    under an epoch its intent was not committed in (``mutation_without_intent``); seed 178276053 showed the worse
    case, a controller amnesia taking the lease between two calls (``mutation_while_halted``). Each per-machine call
    is a mutation: the adapter asks the gate's permit (``domain.permit``) before each call after the first, and stops
    the op short when the lease that admitted it is no longer held in that epoch; the shortfall is a new op."""
    assert not violated(1708)
    assert not violated(178276053)


def test_seed_746307392_a_legacy_world_settles_after_its_longest_hang():
    """Found by the 10,000-seed campaign from 746300838 (a legacy world with warm headroom): a per-machine op held
    180 s by a call hung just before the last fault (requestMachines' timeout) was failed at 385 s, and its
    replacement could not join by 400 s. Not the daemon's: legacy worlds now settle 100 s longer."""
    world = World(746307392, keep_trace=False, legacy_share=LEGACY_CHANCE, fleet_share=0.3)
    assert world.settings.legacy and world.settings.headroom
    assert not run_world(world).violations


def test_seeds_740275542_and_740279741_a_loss_judged_at_run_time_is_not_attributed_later():
    """Found by the 10,000-seed campaign from 740273304: a lost call was not told apart from another op's call
    still running, so its op was failed; once that call answered, the orphan report's read attributed the lost call
    after all, and its machine ran with no fact and no report naming it. A loss judged while the daemon ran
    (``PluginCall.judged``) is attributed then or never; only a call lost across a restart is attributed later."""
    for seed in (740275542, 740279741):
        world = World(seed, keep_trace=False, legacy_share=LEGACY_CHANCE, fleet_share=0.3)
        assert world.settings.legacy
        assert not run_world(world).violations, seed


def test_seed_741612362_a_call_that_waited_for_an_earlier_one_needs_the_lease_that_admitted_it():
    """Found by the 3,000-seed campaign from 741612330: a return admitted under 4.2 waited (the adapter makes a call
    about an op only once that op's earlier calls have ended) for the call a killed process had left hanging, and
    ran 82 s later under 5.1, an epoch its intent was never committed in (``mutation_without_intent``). The adapter
    asks the gate's permit after that wait; a lost lease is a ``LeaseError`` and the intent is committed again."""
    world = World(741612362, keep_trace=False, legacy_share=LEGACY_CHANCE, fleet_share=0.3)
    assert world.settings.legacy
    assert not run_world(world).violations


def test_seed_741613929_a_listing_that_fails_fails_no_op_with_answered_calls():
    """Found by the same campaign: a per-machine op had two calls answered (two machines) and one lost when the
    daemon was killed; the restarted daemon listed the op while the plugin crashed on every read, took the failed
    listing as "nothing", and failed the op: both machines ran with no fact (``failed_with_machines``). Only the
    adapter's "nothing answered, nothing listable" is empty; a failed listing leaves the intent open for a later
    pass, both at recovery and before a planned fail."""
    world = World(741613929, keep_trace=False, legacy_share=LEGACY_CHANCE, fleet_share=0.3)
    assert world.settings.legacy
    assert not run_world(world).violations
