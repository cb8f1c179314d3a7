"""A ``DrainRequested`` goes only to a controller that announced it knows the fact (``JoinReply.drains``): an older
controller could not decode it and would close the link (issue 20, item 4)."""

from __future__ import annotations

import pytest
import trio

from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session_settings import LinkState
from provisionerd.domain.errors import ControllerRejected
from provisionerd.domain.model import CommittedFact, DrainRequested, Epoch, Lost
from provisionerd.wire.messages import FactAck, FactCommit

DRAIN = DrainRequested("p", Epoch(1, 1), "op-1", ("m-1",), "max_ttl", 1.0)


class StubSession:
    """The part of ``ControllerSession`` that ``ControllerOps.commit`` uses."""

    def __init__(self, drains: bool) -> None:
        self.state = LinkState.UP
        self.controller_drains = drains
        self.sent: list[object] = []
        self.committed: list[CommittedFact] = []

    async def request(self, msg: object) -> FactAck:
        self.sent.append(msg)
        return FactAck(len(self.sent))

    def note_committed(self, committed: CommittedFact) -> None:
        self.committed.append(committed)


def test_a_drain_is_not_sent_to_a_controller_that_does_not_know_it() -> None:
    async def main() -> None:
        session = StubSession(drains=False)
        ops = ControllerOps(session)  # type: ignore[arg-type]
        with pytest.raises(ControllerRejected) as caught:
            await ops.commit(DRAIN)
        assert caught.value.reason == "invalid" and session.sent == []
        assert ops.drains_refused == 1
        lost = Lost("p", Epoch(1, 1), "op-2", "m-2", "vanished")
        assert await ops.commit(lost) == 1  # every other fact goes as before
        assert session.sent == [FactCommit(lost)]

    trio.run(main)


def test_a_drain_is_sent_to_a_controller_that_announced_drains() -> None:
    async def main() -> None:
        session = StubSession(drains=True)
        ops = ControllerOps(session)  # type: ignore[arg-type]
        assert await ops.commit(DRAIN) == 1
        assert session.sent == [FactCommit(DRAIN)] and ops.drains_refused == 0

    trio.run(main)
