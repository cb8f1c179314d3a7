"""The agent keeps the credential its first join was given and presents it on every later join (MockClock)."""

from __future__ import annotations

import pytest
import trio
from agent_fakes import FakeController
from test_agent_shell import ADDRS, REF, TOKEN, NoJitter, events, on_mock_clock

from provisionerd.agent.worker import (
    EXIT_TOKEN_REFUSED,
    AgentConfig,
    Credentials,
    Joined,
    Orphaned,
    WorkerAgent,
    judge_join_reply,
)
from provisionerd.wire.messages import JoinReply

SECRET = "cred-v1:" + "k" * 43


def test_the_accepted_reply_s_credential_is_kept_out_of_repr_and_presented_from_then_on() -> None:
    joined = judge_join_reply(JoinReply(True, 3, primary=True, controller_id="r1", credential=SECRET))
    assert joined == Joined(3, "r1", SECRET) and SECRET not in repr(joined)
    credentials = Credentials(REF, TOKEN)
    assert credentials.current() == TOKEN
    credentials.accepted(SECRET)
    assert credentials.current() == SECRET and SECRET not in repr(credentials) and TOKEN not in repr(credentials)
    credentials.sent_without_answer()
    assert not credentials.maybe_spent and credentials.current() == SECRET
    assert not credentials.refused()  # a refused credential is final: no proof is tried
    credentials.accepted("")  # a rejoin's reply issues none: the credential stays
    assert credentials.current() == SECRET


def make(nursery: trio.Nursery, **config: object) -> tuple[FakeController, WorkerAgent]:
    fake = FakeController(nursery, ADDRS, issue_credentials=True)
    fake.allow(REF, TOKEN)
    return fake, WorkerAgent(AgentConfig(ADDRS, REF, **config), TOKEN, fake.connect, rng=NoJitter())  # type: ignore[arg-type]


@on_mock_clock
async def test_after_a_failover_the_agent_rejoins_with_its_credential_not_the_proof() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        nursery.start_soon(agent.run)
        await trio.sleep(20)
        fake.fail_over()
        await trio.sleep(1)
        assert [what for _, _, what in events(fake)] == [
            "connect",
            "join:token",
            "connect",
            "join:credential",
            "redirect",
            "connect",
            "join:credential",
        ]
        assert agent.joins == 2 and agent.connected_to == "b:2"
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_refused_credential_is_kept_and_tried_again_until_the_orphan_timeout() -> None:
    """The controller refuses the credential (the machine was returned, or the controller lost its store and no
    admin has decided yet: issue 31 finding 4). The agent keeps it and tries again, backing off; only its orphan
    timeout ends it, with exit code 3. A controller that knows the credential again lets it back in."""
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, orphan_timeout=300.0)
        kept: dict[str, str] = {}

        async def revoke_and_fail_over() -> None:
            await trio.sleep(10)
            kept.update(fake.credentials)
            fake.credentials.clear()
            fake.fail_over()

        nursery.start_soon(revoke_and_fail_over)
        nursery.start_soon(agent.run)
        await trio.sleep(100)
        assert agent.joins == 1 and agent.refusals >= 4
        assert {what for _, _, what in events(fake)[4:]} <= {"connect", "join:credential", "refused", "redirect"}
        fake.credentials.update(kept)  # the admin restored the store
        await trio.sleep(65)
        assert agent.joins == 2 and agent.refusal == ""
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_credential_refused_until_the_orphan_timeout_ends_the_agent_with_exit_code_3() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, orphan_timeout=120.0)

        async def revoke_and_fail_over() -> None:
            await trio.sleep(10)
            fake.credentials.clear()
            fake.fail_over()

        nursery.start_soon(revoke_and_fail_over)
        with pytest.raises(Orphaned) as orphaned:
            await agent.run()
        assert orphaned.value.exit_code == EXIT_TOKEN_REFUSED
        assert [what for _, _, what in events(fake)][-2:] == ["join:credential", "refused"]
        nursery.cancel_scope.cancel()


def test_an_address_bound_join_claims_the_machine_until_the_controller_names_the_instance() -> None:
    credentials = Credentials("", "bootstrap-secret-of-the-cluster", claim="i-0abc")
    assert credentials.current() == "bootstrap-v1:bootstrap-secret-of-the-cluster"
    assert credentials.machine_claim() == "i-0abc" and not credentials.refused()  # no proof: nothing was spent
    joined = judge_join_reply(JoinReply(True, 1, primary=True, credential=SECRET, instance_ref="c1/i-1"))
    assert isinstance(joined, Joined) and joined.instance_ref == "c1/i-1"
    credentials.accepted(joined.credential, joined.instance_ref)
    assert (credentials.instance_ref, credentials.machine_claim(), credentials.current()) == ("c1/i-1", "", SECRET)
