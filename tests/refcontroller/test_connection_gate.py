"""The gate's caps and its refusal record, without sockets."""

from __future__ import annotations

import logging
from contextlib import ExitStack

import pytest

from refcontroller.gate import Gate, Limits


def test_caps_on_connections_total_and_per_address_and_the_slots_come_back(caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate(Limits(max_connections=3, max_per_address=2))
    caplog.set_level(logging.WARNING, logger="refcontroller.gate")
    with ExitStack() as stack:
        assert [stack.enter_context(gate.admit("10.0.0.1")) for _ in range(3)] == [True, True, False]
        assert stack.enter_context(gate.admit("10.0.0.2")) is True
        assert stack.enter_context(gate.admit("10.0.0.3")) is False  # three open in all
        assert gate.status()["connections"] == 3
    assert gate.status()["connections"] == 0 and gate.open_by_address == {}
    assert gate.status()["peak_connections"] == 3
    assert gate.status()["refusals"] == {"connections_per_address": {"-": 1}, "connections_total": {"-": 1}}
    assert "refused reason=connections_per_address peer=10.0.0.1 role=-: 2 open from it" in caplog.text
    with gate.admit("10.0.0.1") as admitted:
        assert admitted


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_per_address"):
        Limits(max_per_address=0)
