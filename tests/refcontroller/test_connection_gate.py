"""The gate's caps and its refusal record, without sockets."""

from __future__ import annotations

import logging
from contextlib import ExitStack

import pytest
from rc_client import on_mock_clock

from refcontroller.gate import Gate, Limits


def test_the_total_cap_refuses_and_the_slots_come_back(caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate(Limits(max_connections=3, max_per_address=2))
    caplog.set_level(logging.WARNING, logger="refcontroller.gate")
    with ExitStack() as stack:
        tickets = [stack.enter_context(gate.admit(f"10.0.0.{n}")) for n in (1, 1, 2, 3)]
        assert [t is not None for t in tickets] == [True, True, True, False]  # three open in all
        assert gate.status()["connections"] == 3
    assert gate.status()["connections"] == 0 and gate.open_by_address == {} and gate.unauthenticated == {}
    assert gate.status()["peak_connections"] == 3
    assert gate.status()["refusals"] == {"connections_total": {"-": 1}}
    assert "refused reason=connections_total peer=10.0.0.3 role=-: 3 connections open" in caplog.text
    with gate.admit("10.0.0.1") as ticket:
        assert ticket is not None


@on_mock_clock
async def test_a_full_unauthenticated_budget_closes_its_oldest_connection_for_a_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Idle sockets cannot hold an address shut: the newest connection always gets its handshake."""
    gate = Gate(Limits(max_connections=10, max_per_address=2))
    caplog.set_level(logging.WARNING, logger="refcontroller.gate")
    with ExitStack() as stack:
        first, second, third = (stack.enter_context(gate.admit("10.0.0.1")) for _ in range(3))
        assert first is not None and second is not None and third is not None
        assert first.evicted and first.scope.cancel_called
        assert not second.scope.cancel_called and not third.scope.cancel_called
        assert list(gate.unauthenticated["10.0.0.1"]) == [second, third]
        assert gate.status()["refusals"] == {"connections_per_address": {"-": 1}}
        assert "2 unauthenticated connections open from it: the oldest closed for a new one" in caplog.text
    assert gate.status()["connections"] == 0 and gate.unauthenticated == {}


@on_mock_clock
async def test_authenticated_connections_have_their_own_budget_per_address() -> None:
    gate = Gate(Limits(max_connections=10, max_per_address=2, max_authenticated_per_address=3))
    with ExitStack() as stack:
        peers = []
        for _ in range(3):  # each one past its handshake before the next connects
            ticket = stack.enter_context(gate.admit("10.0.0.1"))
            assert ticket is not None and gate.authenticate(ticket, "worker")
            peers.append(ticket)
        # Three past the handshake, none waiting: two unauthenticated ones fit beside them, evicting nobody.
        idle = [stack.enter_context(gate.admit("10.0.0.1")) for _ in range(2)]
        assert not any(t.scope.cancel_called for t in peers + idle if t is not None)
        assert gate.status()["authenticated"] == 3 and gate.status()["connections"] == 5
        # A fourth authenticated one from the address is over its own budget.
        assert idle[0] is not None and not gate.authenticate(idle[0], "worker")
        assert gate.status()["refusals"] == {"connections_per_address": {"worker": 1}}
    assert gate.status()["connections"] == 0 and gate.authenticated_by_address == {} and gate.unauthenticated == {}


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_per_address"):
        Limits(max_per_address=0)
    with pytest.raises(ValueError, match="max_authenticated_per_address"):
        Limits(max_authenticated_per_address=0)
