"""Issue 33: the instance facts of machines that exist, refused because the lease was lost (``no_lease`` or
``stale_epoch`` from the controller, or no valid lease locally), land as soon as the lease is held again, not
``recover_after`` (30 s) later through recovery. An independent controller met it: after a restart that
interrupted a request, the instance facts were refused ``noLease`` and landed 30 s later.

On trio's ``MockClock``: the fact is committed again (``LeasedFacts.commit`` stamps the epoch held at that moment)
once ``LeasedFacts.wait_leased(provider)`` returns, within the ``STORAGE_RETRY_FOR`` bound; a lost link (the outcome
is unknown) is still left to recovery.
"""

from __future__ import annotations

import hashlib

import pytest
import trio
import trio.testing

from provisionerd.domain.errors import ControllerRejected, LeaseError, LinkDown, MutationsHalted
from provisionerd.domain.model import NO_EPOCH, ProviderMachine, RequestIntent
from provisionerd.execution.steps import FlowDeps, Steps
from provisionerd.execution.values import ExecutorSettings
from provisionerd.telemetry.events import EventLog

INTENT = RequestIntent("sim", NO_EPOCH, "op-1", "t", 1, ("op-1/0",), (hashlib.sha256(b"x").hexdigest(),))
MADE = [ProviderMachine("m-1", result="succeed", instance_ref="op-1/0")]

#: When the fake's lease is held again (the keeper re-acquired: the last grantee is re-granted at once).
REGRANTED_AT = 0.5


class LeaseLostFacts:
    """``LeasedFacts`` as the steps use it: refuses the first commit with ``error``, then takes them; the provider's
    lease is held again at ``REGRANTED_AT``."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.tries: list[float] = []
        self.committed: list[object] = []

    def view(self) -> None:
        return None

    async def commit(self, fact: object) -> int:
        self.tries.append(trio.current_time())
        if len(self.tries) == 1:
            raise self.error
        self.committed.append(fact)
        return len(self.committed)

    async def wait_leased(self, provider: str) -> None:
        assert provider == INTENT.provider
        await trio.sleep_until(REGRANTED_AT)


def run(facts: LeaseLostFacts) -> tuple[str, ...] | None:
    settings = ExecutorSettings(cluster="c", controllers=("ctl:1",))
    steps = Steps(FlowDeps(settings, {}, None, facts, EventLog(None), lambda: 0.0))  # type: ignore[arg-type]

    async def main() -> tuple[str, ...] | None:
        return await steps.commit_instances(INTENT, MADE)

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ControllerRejected("no_lease"), id="controller-no_lease"),
        pytest.param(ControllerRejected("stale_epoch"), id="controller-stale_epoch"),
        pytest.param(LeaseError("sim", "lapsed"), id="local-no-lease"),
    ],
)
def test_an_instance_fact_refused_for_a_lost_lease_lands_once_the_lease_is_held_again(error: Exception) -> None:
    facts = LeaseLostFacts(error)
    assert run(facts) == ("m-1",)
    assert facts.tries == [0.0, REGRANTED_AT]


def test_a_lost_link_is_still_left_to_recovery() -> None:
    """The fact may have landed (its outcome is unknown): recovery reads the view before committing again."""
    facts = LeaseLostFacts(LinkDown("the link broke"))
    assert run(facts) is None and len(facts.tries) == 1


def test_a_halt_is_not_waited_out() -> None:
    """Every mutation is stopped until an admin decides: the commit is left to recovery, not retried."""
    facts = LeaseLostFacts(MutationsHalted("sim", "controller amnesia"))
    assert run(facts) is None and len(facts.tries) == 1
