"""The harness itself: reproducible from the seed alone, a clean campaign, the network's faults, the checkers."""

from __future__ import annotations

import json
import random

import pytest
import trio
import trio.testing
from rigs import procs

from provisionerd.domain.model import Epoch
from provisionerd.testing.simulation import World, invariants, run_seed
from provisionerd.testing.simulation.faults import KINDS, draw_plan
from provisionerd.testing.simulation.network import SimNet
from provisionerd.testing.simulation.observe import Belief, Recorder
from provisionerd.testing.simulation.runner import run_world
from provisionerd.wire.framing import FramedStream
from provisionerd.wire.messages import DemandPage, Heartbeat, HeartbeatAck


@pytest.mark.parametrize("workload", ["gate", "lifecycle"])
def test_the_same_seed_gives_the_same_trace(workload):
    runs = []
    for _ in range(2):
        world = World(11, workload=workload)
        result = run_world(world)
        runs.append((result.digest, world.recorder.trace, result.violations))
    (digest_a, trace_a, violations_a), (digest_b, trace_b, violations_b) = runs
    assert trace_a == trace_b and digest_a == digest_b and violations_a == violations_b == ()
    assert len(trace_a) > 50  # something happened: joins, leases, provider calls
    assert any(" mutation " in line for line in trace_a)


def test_different_seeds_give_different_runs():
    digests = {run_seed(seed, workload="gate", horizon=60.0, settle=20.0).digest for seed in range(4)}
    assert len(digests) == 4


@pytest.mark.process
def test_a_seed_repeats_in_another_process_with_another_hash_seed():
    """What a failing seed printed by CI must do on a laptop: no dependence on set order or addresses."""
    digests = []
    for hash_seed in ("1", "987"):
        out = procs.run(procs.provisionerd("simulate", "--trace", "2"), env={"PYTHONHASHSEED": hash_seed})
        digests.append(json.loads(out.stdout.strip().splitlines()[-1])["digest"])
    assert digests[0] == digests[1]


@pytest.mark.sweep
def test_a_small_campaign_is_clean():
    results = [run_seed(seed) for seed in range(100, 108)]
    assert [(r.seed, r.first) for r in results if not r.ok] == []
    assert sum(len(r.faults) for r in results) > 10  # the faults really were injected
    assert sum(r.counts.get("mutation", 0) for r in results) > 10


def test_the_fault_plan_is_drawn_from_the_seed_and_ends_within_the_horizon():
    plans = [draw_plan(random.Random(seed), horizon=200.0, slots=("a", "b"), replicas=3) for seed in range(200)]
    assert plans[5] == draw_plan(random.Random(5), horizon=200.0, slots=("a", "b"), replicas=3)
    faults = [f for p in plans for f in p.faults]
    assert {f.kind for f in faults} == set(KINDS)
    assert all(5.0 <= f.at and f.ends <= 200.0 + 1e-9 for f in faults)


# --- the simulated network --------------------------------------------------------------------------------------


def _net_pair(net_rng_seed=1):
    """A SimNet whose server side is captured; returns (net, accepted list)."""
    accepted = []
    net = SimNet(random.Random(net_rng_seed), ("ctl0:7400",), lambda stream, replica: accepted.append(stream))
    net.add_slot("a")
    net.slots["a"].latency = 0.01
    return net, accepted


def _mock(fn):
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_network_delivers_in_order_after_the_latency_and_stalls_until_healed():
    async def main():
        net, accepted = _net_pair()
        client = FramedStream(await net.connect("a", "ctl0:7400"))
        server = FramedStream(accepted[0])
        start = trio.current_time()
        await client.send(Heartbeat(1), 5)
        got = await server.receive()
        first = (got.msg, got.corr, trio.current_time() - start)
        net.set_direction("a", "c2s", "stall")
        await client.send(Heartbeat(2), 6)
        with trio.move_on_after(30):
            await server.receive()
            raise AssertionError("a stalled frame arrived")
        net.set_direction("a", "c2s", "ok")
        late = await server.receive()
        net.set_direction("a", "c2s", "drop")
        await client.send(Heartbeat(3), 7)
        net.set_direction("a", "c2s", "ok")
        await client.send(Heartbeat(4), 8)
        after_drop = await server.receive()
        return first, late.msg, after_drop.msg

    first, late, after_drop = _mock(main)
    assert first[:2] == (Heartbeat(1), 5) and 0.01 <= first[2] <= 0.0121
    assert late == Heartbeat(2) and after_drop == Heartbeat(4)


def test_dropping_pushes_keeps_replies_and_connects_fail_during_a_partition():
    async def main():
        net, accepted = _net_pair()
        client = FramedStream(await net.connect("a", "ctl0:7400"))
        server = FramedStream(accepted[0])
        net.set_direction("a", "s2c", "ok", drop_pushes=True)
        await server.send_many([(DemandPage(1, 0, 1, ()), 0), (HeartbeatAck(1, 1), 9)])
        got = await client.receive()
        net.set_direction("a", "c2s", "drop")
        with pytest.raises(OSError):
            await net.connect("a", "ctl0:7400")
        await server.aclose()
        net.set_direction("a", "c2s", "ok")
        return got, await client.receive()

    got, eof = _mock(main)
    assert (got.msg, got.corr) == (HeartbeatAck(1, 1), 9) and eof is None


# --- the checkers on made-up observations ---------------------------------------------------------------------


def _history(*beliefs, grants):
    rec = Recorder()
    rec.beliefs = [Belief(i, "sim", Epoch(*e), s, u) for i, e, s, u in beliefs]
    rec.grants = {("sim", Epoch(*e)): at for e, at in grants.items()}
    invariants.check_lease_history(rec)
    return [v.invariant for v in rec.violations]


def test_the_lease_history_rule():
    # b got 1.2 at 50 after a's 1.1 ended at 48: fine.
    assert _history(("a#1", (1, 1), 0, 48), ("b#1", (1, 2), 50, 90), grants={(1, 1): 0, (1, 2): 50}) == []
    # a still trusted 1.1 until 52, but 1.2 was granted at 50: unsafe even though b only heard of it at 53.
    assert _history(("a#1", (1, 1), 0, 52), ("b#1", (1, 2), 53, 90), grants={(1, 1): 0, (1, 2): 50}) == [
        "two_lease_holders"
    ]
    # the same epoch trusted by a killed instance and its successor, one after the other: fine; overlapping: not.
    assert _history(("a#1", (1, 1), 0, 20), ("a#2", (1, 1), 25, 40), grants={(1, 1): 0}) == []
    assert _history(("a#1", (1, 1), 0, 30), ("a#2", (1, 1), 25, 40), grants={(1, 1): 0}) == ["two_lease_holders"]
    # one instance going back to an older epoch (also unsafe: 1.5 trusted after 2.1 was granted)
    assert _history(("a#1", (2, 1), 0, 10), ("a#1", (1, 5), 20, 30), grants={(2, 1): 0, (1, 5): 0}) == [
        "two_lease_holders",
        "epoch_regressed",
    ]
