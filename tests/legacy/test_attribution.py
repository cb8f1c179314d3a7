"""A lost legacy call's request found in the plugin's own state file (``legacy.attribution``): taken as the call's
answer only when nothing else can have made it. The rule alone (hypothesis), then the shipped example's plugin
killed mid-call at its timeout, its machines tracked instead of left without a fact."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings
from provisionerd.provider.legacy.attribution import SKEW_MS, LostCall, request_of_lost_call
from provisionerd.provider.legacy.journal import ACCEPTED
from provisionerd.provider.legacy.state_files import PluginMachine, PluginRequest
from provisionerd.provider.oneshot import OneShotProvider

CALL = LostCall("small", 2, started_ms=1_000_000)


def request(rid: str, template: str = "small", n: int = 2, status: str = "running", at: int = 1_000_500) -> Any:
    machines = tuple(PluginMachine(f"{rid}-m{i}", f"h{i}", status, "10.0.0.1", False) for i in range(n))
    return PluginRequest(rid, template, at, machines)


def test_the_one_request_only_the_lost_call_can_have_made_is_its_answer() -> None:
    assert request_of_lost_call(CALL, [request("r-1")], known=()) == request("r-1")
    assert request_of_lost_call(CALL, [request("r-1")], known={"r-1"}) is None  # answered to another call
    assert request_of_lost_call(CALL, [request("r-1", template="large")], known=()) is None
    assert request_of_lost_call(CALL, [request("r-1", n=3)], known=()) is None
    assert request_of_lost_call(CALL, [request("r-1", status="terminated")], known=()) is None
    assert request_of_lost_call(CALL, [request("r-1", at=CALL.started_ms - SKEW_MS - 1)], known=()) is None
    assert request_of_lost_call(CALL, [request("r-1", at=0)], known=()) == request("r-1", at=0)  # time unrecorded
    assert request_of_lost_call(CALL, [request("r-1"), request("r-2")], known=()) is None  # which one? no guess
    assert request_of_lost_call(CALL, [request("r-1")], known=(), rivals=[LostCall("small", 2)]) is None


def test_a_rival_that_had_ended_before_the_request_was_made_did_not_make_it() -> None:
    """Seed 84 of the legacy simulation: an earlier lost call that had made nothing stayed a rival of every later
    lost call of the same shape, so none was ever attributed and their machines ran with no fact."""
    call = LostCall("small", 2, started_ms=1_000_000, ended_ms=1_020_000)
    made = request("r-1", at=1_010_000)
    ended_long_before = LostCall("small", 2, started_ms=900_000, ended_ms=1_010_000 - SKEW_MS - 1)
    still_running = LostCall("small", 2, started_ms=900_000, ended_ms=0)
    ended_within_skew = LostCall("small", 2, started_ms=900_000, ended_ms=1_010_000 - SKEW_MS)
    started_after = LostCall("small", 2, started_ms=1_010_000 + SKEW_MS + 1)
    assert request_of_lost_call(call, [made], known=(), rivals=[ended_long_before]) == made
    assert request_of_lost_call(call, [made], known=(), rivals=[started_after]) == made
    assert request_of_lost_call(call, [made], known=(), rivals=[still_running]) is None
    assert request_of_lost_call(call, [made], known=(), rivals=[ended_within_skew]) is None
    assert request_of_lost_call(call, [request("r-1", at=1_020_000 + SKEW_MS + 1)], known=()) is None  # after it
    assert request_of_lost_call(call, [request("r-1", at=0)], known=(), rivals=[ended_long_before]) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["small", "large"]), st.integers(1, 3), st.sampled_from(["running", "terminated"])),
        max_size=6,
    ),
    st.sets(st.integers(0, 5)),
)
def test_a_request_is_attributed_only_when_it_is_the_single_candidate(specs: list, known_ix: set[int]) -> None:
    requests = [request(f"r-{i}", t, n, s) for i, (t, n, s) in enumerate(specs)]
    known = {f"r-{i}" for i in known_ix}
    found = request_of_lost_call(CALL, requests, known)
    fits = [
        r for r in requests
        if r.request_id not in known and r.template_id == "small" and len(r.machines) == 2
        and any(m.status != "terminated" for m in r.machines)
    ]  # fmt: skip
    assert found == (fits[0] if len(fits) == 1 else None)


@pytest.mark.process
def test_a_plugin_killed_at_its_timeout_after_making_its_machines_has_them_tracked(world: Any, h: Any) -> None:
    """``bench/restarts.py`` (legacy, 30 min): 8 plugin kills after the machines were made left 14 machines running
    with no fact. With ``state_file = "lsfexample"`` the lost call's request is found in the plugin's state and
    polled as if it had answered: both machines are reported, nothing is left an unknown outcome."""
    world.settings({"BOOT_POLLS": 1, "SLOW_REQUEST_SECONDS": 60, "SLOW_REQUEST_PHASE": "after_create"})

    async def main() -> tuple[dict[str, Any], list[Any], Any]:
        settings = LegacySettings(journal_path=str(world.journal), state_file="lsfexample")
        client = LegacyProvider(OneShotProvider(world.config()), settings)
        out = await client.call("requestMachines", world.request("op-1", 2), timeout=2.0)
        entry = await h.settle(client, out["requestId"])
        return entry, client.unknown_outcomes(), client.journal.creates["op-1"].calls[0]

    entry, unknown, call = trio.run(main)
    assert call.state == ACCEPTED and "found in" in call.detail
    assert entry["status"] == "complete" and len(entry["machines"]) == 2
    assert sorted(m["machineId"] for m in entry["machines"]) == sorted(world.plugin_machines())
    assert unknown == [] and len(world.inputs("requestMachines")) == 1
