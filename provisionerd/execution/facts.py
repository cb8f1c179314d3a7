"""The executor's access to the fact log: the facts as the session sees them now, and commits of non-mutating facts
(``InstanceFact``, ``RequestFailed``, ``Returned``, ``Lost`` ...) stamped with the lease epoch held at that moment.

Mutating facts (the intents) never come here: they pass ``MutationGate.mutation``, which also admits the call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.domain.errors import ControllerRejected, LeaseError
from provisionerd.domain.model import Epoch, Fact
from provisionerd.execution.gate import LEASE_LOST_REASONS, FactCommitter
from provisionerd.execution.values import GATE_ERRORS
from provisionerd.planner.fact_view import FactView

log = logging.getLogger(__name__)


@attrs.frozen
class LeasedFacts:
    """``leases``: the keeper of each provider served. ``committer``: commits on the primary. ``read``: the facts
    of the session's view (``None`` while there is none)."""

    leases: Mapping[str, LeaseKeeper]
    committer: FactCommitter
    read: Callable[[], FactView | None]

    def view(self) -> FactView | None:
        return self.read()

    def epoch_now(self, provider: str) -> Epoch | None:
        """The epoch of ``provider``'s lease if it is valid now (``None``: no lease, or it lapsed)."""
        keeper = self.leases.get(provider)
        try:
            return None if keeper is None else keeper.current()
        except LeaseError:
            return None

    async def wait_leased(self, provider: str) -> None:
        """Return once ``provider``'s lease is valid (at once if it is; forever for a provider not served)."""
        keeper = self.leases.get(provider)
        if keeper is None:
            await trio.sleep_forever()
        await keeper.wait_valid()

    async def commit(self, fact: Fact) -> int:
        """Commit a non-mutating fact stamped with the current lease epoch; its log index.

        Raises ``LeaseError`` (no valid lease), ``ControllerRejected`` (a lease-lost rejection also lapses the
        keeper) or ``LinkDown`` (outcome unknown)."""
        keeper = self.leases.get(fact.provider)
        if keeper is None:
            raise LeaseError(fact.provider, "this daemon does not serve it")
        epoch = keeper.current()
        try:
            return await self.committer.commit(attrs.evolve(fact, epoch=epoch))
        except ControllerRejected as exc:
            if exc.reason in LEASE_LOST_REASONS:
                keeper.invalidate(epoch, f"fact rejected: {exc.reason}")
            raise

    async def commit_quietly(self, fact: Fact) -> bool:
        """``commit``, logging a failure instead of raising it; whether the fact was committed. For facts whose
        loss recovery repairs (the intent stays open, the planner or ``recover_request`` settles it later)."""
        try:
            await self.commit(fact)
            return True
        except GATE_ERRORS as exc:
            log.warning("could not commit %s for %s: %s", type(fact).__name__, fact.op_id, exc)
            return False
