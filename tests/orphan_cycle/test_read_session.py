"""The controller view an orphan pass may use: only one resynced after the provider's last lease grant."""

from __future__ import annotations

import math

import attrs
import trio
import trio.testing

from provisionerd.controller.session_settings import LinkState
from provisionerd.domain.model import DemandSnapshot, LicenseUse
from provisionerd.execution.orphan_reads import SettleTracker, read_session
from provisionerd.orphans.model import Unreadable
from provisionerd.planner.fact_view import FactView


@attrs.define
class _View:
    generation: int = 1
    facts: FactView = attrs.field(factory=FactView)
    hosts: dict = attrs.field(factory=dict)
    demand: DemandSnapshot | None = None  # the controller's licence use travels on it


@attrs.define
class _Session:
    synced: set[str] = attrs.field(factory=set)
    state: LinkState = LinkState.UP
    view: _View = attrs.field(factory=_View)
    last_error: str = ""
    up_since: float = math.inf

    def synced_for(self, provider: str) -> bool:
        return provider in self.synced


def test_a_view_older_than_the_lease_grant_is_unreadable_for_that_provider() -> None:
    async def main() -> None:
        session = _Session(synced={"other"})
        stale = read_session(session, SettleTracker(0.0), "sim")  # type: ignore[arg-type]
        assert isinstance(stale.view, Unreadable)
        assert "predates the lease grant" in stale.view.reason
        session.synced.add("sim")
        fresh = read_session(session, SettleTracker(0.0), "sim")  # type: ignore[arg-type]
        assert fresh.view is session.view.facts
        # Without a provider (the admin commands) the grant does not matter.
        assert read_session(_Session(), SettleTracker(0.0)).view is not None  # type: ignore[arg-type]

    trio.run(main)


def test_the_controllers_licence_use_is_read_from_its_demand_snapshot() -> None:
    uses = (LicenseUse("sim", "matlab", 0), LicenseUse("other", "matlab", 4))

    async def main() -> None:
        session = _Session(synced={"sim"}, view=_View(demand=DemandSnapshot(3, (), uses)))
        assert read_session(session, SettleTracker(0.0), "sim").licenses_in_use == {"matlab": 0}  # type: ignore[arg-type]
        silent = _Session(synced={"sim"}, view=_View(demand=DemandSnapshot(3)))
        assert read_session(silent, SettleTracker(0.0), "sim").licenses_in_use is None  # type: ignore[arg-type]

    trio.run(main)


def test_the_settle_window_counts_from_when_the_generation_came_up_not_from_the_first_read() -> None:
    async def main() -> None:
        now = trio.current_time()
        tracker = SettleTracker(10.0)
        session = _Session(synced={"sim"}, up_since=now - 4)
        assert not read_session(session, tracker, "sim").controller.settled  # type: ignore[arg-type]
        await trio.sleep(6)
        assert read_session(session, tracker, "sim").controller.settled  # type: ignore[arg-type]
        # A new generation came up 1 s ago: the window starts again from then.
        session.view = _View(generation=2)
        session.up_since = trio.current_time() - 1
        assert not read_session(session, tracker, "sim").controller.settled  # type: ignore[arg-type]
        await trio.sleep(9)
        assert read_session(session, tracker, "sim").controller.settled  # type: ignore[arg-type]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
