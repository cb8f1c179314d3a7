"""The mutation gate: lease valid now, intent acknowledged, lease still valid, and only then the call."""

from __future__ import annotations

import pytest
import trio

from provisionerd.domain.errors import ControllerRejected, LeaseError
from provisionerd.domain.model import NO_EPOCH, Epoch, RequestIntent, ReturnIntent
from provisionerd.execution.gate import GateDecision, MutationGate, violations
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_controller import FakeController


def intent(op_id: str, provider: str = "sim") -> RequestIntent:
    return RequestIntent(
        provider=provider,
        epoch=NO_EPOCH,
        op_id=op_id,
        template_id="t",
        count=1,
        instance_refs=(f"ref-{op_id}",),
        token_hashes=("ab" * 32,),
    )


def setup(make_keeper, *, ack_delay: float = 0.0):
    """A keeper whose lease link can be partitioned, and a gate whose fact link stays up."""
    controller = FakeController(ttl=30.0, grace=30.0)
    events = EventLog()
    lease_link = controller.link("a", request_timeout=5.0)
    fact_link = controller.link("a", ack_delay=ack_delay)
    keeper = make_keeper("sim", lease_link, events, margin=2.0)
    gate = MutationGate({"sim": keeper}, fact_link, events)
    return controller, lease_link, keeper, gate, events


def test_mutations_stop_exactly_at_the_local_deadline(mock_run, make_keeper):
    controller, lease_link, keeper, gate, events = setup(make_keeper)
    calls: list[tuple[float, Epoch]] = []
    refused: list[float] = []

    async def attempt(op_id: str) -> None:
        try:
            async with gate.mutation("sim", intent(op_id)) as permit:
                calls.append((trio.current_time(), permit.epoch))
        except LeaseError:
            refused.append(trio.current_time())

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            await keeper.wait_valid()
            await trio.sleep_until(95.0)
            lease_link.partition()  # renewals stop arriving; the last went out at 90: local deadline 118
            times = sorted([100.0 + 0.25 * i for i in range(81)] + [118.0 - 1e-6])
            for t in times:
                await trio.sleep_until(t)
                await attempt(f"op-{t}")
            nursery.cancel_scope.cancel()

    mock_run(main)
    admitted_times = [t for t, _ in calls]
    assert max(admitted_times) == pytest.approx(118.0 - 1e-6)
    assert max(t for t in admitted_times if t != max(admitted_times)) == 117.75
    assert min(refused) == 118.0
    assert next(events.of_kind("lease_lost"))["mono"] == 118.0
    # Every call carried the epoch of a committed intent, and the controller holds exactly those intents.
    committed = {f.fact.op_id: f.fact.epoch for f in controller.facts}
    assert len(committed) == len(calls)
    assert all(epoch == committed_epoch for (_, epoch), committed_epoch in zip(calls, committed.values(), strict=True))
    assert violations(gate.decisions) == []
    assert {d.outcome for d in gate.decisions} == {"admitted", "finished", "no_lease"}


def test_a_lapse_while_waiting_for_the_ack_means_the_call_never_starts(mock_run, make_keeper):
    controller, lease_link, keeper, gate, _ = setup(make_keeper, ack_delay=60.0)
    ran: list[float] = []
    seen: dict[str, object] = {}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            await keeper.wait_valid()
            await trio.sleep_until(95.0)
            lease_link.partition()
            await trio.sleep_until(110.0)
            with pytest.raises(LeaseError) as info:
                async with gate.mutation("sim", intent("op-slow-ack")):
                    ran.append(trio.current_time())
            seen["raised_at"] = trio.current_time()
            seen["error"] = str(info.value)
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert ran == []
    assert seen["raised_at"] == 118.0
    assert "before the intent was acknowledged" in str(seen["error"])
    assert [d.outcome for d in gate.decisions] == ["lapsed_before_ack"]
    assert gate.decisions[0].at == 118.0
    # The intent did reach the controller (its outcome was unknown to us): the next holder resolves its op_id.
    assert [f.fact.op_id for f in controller.facts] == ["op-slow-ack"]


def test_stale_epoch_rejection_lapses_the_lease_and_the_gate_recovers_with_a_new_epoch(mock_run, make_keeper):
    controller, _, keeper, gate, events = setup(make_keeper)
    epochs: list[Epoch] = []

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            first = await keeper.wait_valid()
            await trio.sleep(3.0)
            controller.failover()  # the new primary does not know our epoch; our next renewal is 7 s away
            with pytest.raises(ControllerRejected) as info:
                async with gate.mutation("sim", intent("op-1")):
                    raise AssertionError("must not run")
            assert info.value.reason == "stale_epoch"
            assert not keeper.valid()  # the rejection lapsed the lease at once, before any renewal
            second = await keeper.wait_valid()
            async with gate.mutation("sim", intent("op-2")) as permit:
                epochs.extend([first, second, permit.epoch])
            nursery.cancel_scope.cancel()

    mock_run(main)
    first, second, used = epochs
    assert second > first and used == second
    assert [(f.fact.op_id, f.fact.epoch) for f in controller.facts] == [("op-2", second)]
    assert [d.outcome for d in gate.decisions] == ["rejected", "admitted", "finished"]
    assert next(events.of_kind("lease_lost"))["reason"] == "intent rejected: stale_epoch"


def test_no_lease_no_commit(mock_run, make_keeper):
    controller, lease_link, keeper, gate, _ = setup(make_keeper)

    async def main():
        with pytest.raises(LeaseError):
            async with gate.mutation("sim", intent("op-early")):
                raise AssertionError("must not run")
        with pytest.raises(LeaseError, match="does not serve"):
            async with gate.mutation("other", intent("op-other", provider="other")):
                raise AssertionError("must not run")
        with pytest.raises(ValueError):
            async with gate.mutation("sim", intent("op-x", provider="other")):
                raise AssertionError("must not run")

    mock_run(main)
    assert controller.facts == []
    assert [d.outcome for d in gate.decisions] == ["no_lease"]


def test_return_intents_go_through_the_same_gate(mock_run, make_keeper):
    controller, _, keeper, gate, _ = setup(make_keeper)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            epoch = await keeper.wait_valid()
            ret = ReturnIntent(provider="sim", epoch=NO_EPOCH, op_id="ret-1", machine_ids=("m-1",), reason="idle")
            async with gate.mutation("sim", ret) as permit:
                assert permit.fact == ReturnIntent("sim", epoch, "ret-1", ("m-1",), "idle")
                assert permit.fact_index == 1
            nursery.cancel_scope.cancel()

    mock_run(main)
    assert controller.facts[0].fact.op_id == "ret-1"


def test_the_invariant_checker_catches_bad_admissions():
    good = GateDecision(
        at=1.0,
        provider="sim",
        op_id="a",
        fact_kind="RequestIntent",
        outcome="admitted",
        epoch=Epoch(1, 1),
        fact_epoch=Epoch(1, 1),
        fact_index=3,
        valid_until=2.0,
    )
    assert violations([good]) == []
    import attrs

    late = attrs.evolve(good, op_id="late", at=2.0)
    unacked = attrs.evolve(good, op_id="unacked", fact_index=None)
    wrong = attrs.evolve(good, op_id="wrong", fact_epoch=Epoch(1, 0))
    found = violations([good, late, unacked, wrong])
    assert len(found) == 3
    assert [p.split(":")[0] for p in found] == ["late", "unacked", "wrong"]
