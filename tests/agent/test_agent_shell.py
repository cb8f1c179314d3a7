"""The worker agent's connection logic on MockClock over in-memory streams: exact virtual times."""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
from agent_fakes import FakeController

from provisionerd.agent.token import REJOIN_PREFIX
from provisionerd.agent.worker import (
    EXIT_ORPHANED,
    EXIT_REFUSED,
    EXIT_TOKEN_REFUSED,
    FINAL_REFUSALS,
    AgentConfig,
    Credentials,
    Elsewhere,
    Joined,
    JoinRefused,
    Orphaned,
    Redirect,
    Refused,
    WorkerAgent,
    backoff_delay,
    judge_join_reply,
)
from provisionerd.domain.model import HostStatus
from provisionerd.wire.messages import ErrorMsg, HeartbeatAck, JoinReply

TOKEN = "t0ken-" + "x" * 30
REF = "c1/i-0001"
ADDRS = ("a:1", "b:2", "c:3")


class NoJitter(random.Random):
    def random(self) -> float:
        return 0.0


def on_mock_clock(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        trio.run(functools.partial(fn, *args, **kwargs), clock=trio.testing.MockClock(autojump_threshold=0))

    return wrapper


def make(nursery: trio.Nursery, **config: object) -> tuple[FakeController, WorkerAgent]:
    fake = FakeController(nursery, ADDRS)
    fake.allow(REF, TOKEN)
    agent = WorkerAgent(AgentConfig(ADDRS, REF, **config), TOKEN, fake.connect, rng=NoJitter())  # type: ignore[arg-type]
    return fake, agent


def events(fake: FakeController) -> list[tuple[float, str, str]]:
    return [(round(t, 6), address, what) for t, address, what in fake.log]


# --- pure parts ----------------------------------------------------------------------------------------------


def test_judge_join_reply() -> None:
    assert judge_join_reply(JoinReply(True, 3, primary=True, controller_id="r1")) == Joined(3, "r1")
    assert judge_join_reply(JoinReply(False, 3, primary=False, redirect="h:9")) == Redirect("h:9")
    assert isinstance(judge_join_reply(JoinReply(False, 3, primary=False)), Elsewhere)
    assert judge_join_reply(JoinReply(False, 3, primary=True, reason="bad identity")) == Refused(
        "refused", "bad identity"
    )
    assert judge_join_reply(JoinReply(True, 3, primary=True, protocol_version=2)).code == "version_mismatch"
    assert judge_join_reply(ErrorMsg("token_invalid", "no")) == Refused("token_invalid", "no")
    assert judge_join_reply(ErrorMsg("not_allowed", "x")).code == "not_allowed"
    assert isinstance(judge_join_reply(ErrorMsg("internal", "x")), Elsewhere)
    assert isinstance(judge_join_reply(None), Elsewhere)
    assert isinstance(judge_join_reply(HeartbeatAck(1, 1)), Elsewhere)


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    assert [backoff_delay(n, 0.2, 5.0, NoJitter()) for n in range(7)] == pytest.approx(
        [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    )
    rng = random.Random(7)
    for n in range(100):
        assert 0.5 * min(5.0, 0.2 * 2**n) <= backoff_delay(n, 0.2, 5.0, rng) <= min(5.0, 0.2 * 2**n)


def test_credentials_switch_to_the_proof_and_forget_the_token() -> None:
    creds = Credentials(REF, TOKEN)
    assert creds.current() == TOKEN
    assert not creds.refused()  # refused without any doubt about the token: give up
    creds = Credentials(REF, TOKEN)
    creds.current()
    creds.sent_without_answer()
    assert creds.refused()  # our unanswered join may have spent it: try the proof once
    assert creds.current().startswith(REJOIN_PREFIX)
    assert not creds.refused()
    creds = Credentials(REF, TOKEN)
    creds.accepted()
    assert creds.current().startswith(REJOIN_PREFIX) and TOKEN not in repr(creds) and creds._token is None


# --- the trio shell ------------------------------------------------------------------------------------------


@on_mock_clock
async def test_follows_the_redirect_joins_reports_idle_and_heartbeats() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        fake.primary = 1
        nursery.start_soon(agent.run)
        await trio.sleep(12)
        assert events(fake) == [
            (0, "a:1", "connect"),
            (0, "a:1", "join:token"),
            (0, "a:1", "redirect"),
            (0, "b:2", "connect"),
            (0, "b:2", "join:token"),
        ]
        assert fake.statuses == [(0, HostStatus.IDLE)]
        assert fake.heartbeats == [5, 10]
        assert agent.joins == 1 and agent.connected_to == "b:2" and agent.term == 1
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_rotates_through_the_addresses_with_backoff() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        fake.down = set(ADDRS)
        nursery.start_soon(agent.run)
        await trio.sleep(6.0)
        assert [(t, a) for t, a, _ in events(fake)] == [
            (0, "a:1"),
            (0.2, "b:2"),
            (0.6, "c:3"),
            (1.4, "a:1"),
            (3.0, "b:2"),
        ]
        fake.down = {"a:1", "c:3"}  # b comes back as the primary; c fails at 6.2, a at 11.2, then b at 16.2
        fake.primary = 1
        await trio.sleep(11)
        assert [(t, a) for t, a, w in events(fake) if w == "connect"][-3:] == [
            (6.2, "c:3"),
            (11.2, "a:1"),
            (16.2, "b:2"),
        ]
        assert agent.joins == 1 and fake.statuses == [(16.2, HostStatus.IDLE)]
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_sessions_that_end_at_once_do_not_cause_a_reconnect_storm() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        fake.close_after_accept = True
        nursery.start_soon(agent.run)
        await trio.sleep(4)
        assert [t for t, _, w in events(fake) if w == "connect"] == [0, 0.2, 0.6, 1.4, 3.0]
        assert agent.joins == 5
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_reports_busy_and_idle_when_told() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        agent.set_status(HostStatus.BUSY)  # before the join: reported right after it
        nursery.start_soon(agent.run)
        await trio.sleep(7)
        agent.set_status(HostStatus.IDLE)
        await trio.sleep(1)
        agent.set_status(HostStatus.BUSY)
        await trio.sleep(1)
        assert fake.statuses == [(0, HostStatus.BUSY), (7, HostStatus.IDLE), (8, HostStatus.BUSY)]
        with pytest.raises(ValueError):
            agent.set_status(HostStatus.LOST)
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_rejoins_the_new_primary_with_the_proof_after_a_failover() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        agent.set_status(HostStatus.BUSY)
        nursery.start_soon(agent.run)
        await trio.sleep(20)
        fake.fail_over()  # replica b is primary in term 2; a closes every session
        await trio.sleep(1)
        assert events(fake)[2:] == [
            (20.2, "a:1", "connect"),
            (20.2, "a:1", "join:proof"),
            (20.2, "a:1", "redirect"),
            (20.2, "b:2", "connect"),
            (20.2, "b:2", "join:proof"),
        ]
        assert agent.joins == 2 and agent.term == 2 and agent.connected_to == "b:2"
        assert fake.statuses == [(0, HostStatus.BUSY), (20.2, HostStatus.BUSY)]  # the status is reported again
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_refused_token_is_kept_and_tried_again_until_the_orphan_timeout_then_exit_code_3() -> None:
    """Issue 31 finding 4: a refusal may be "not yet". The token stays in memory; joins go on, 1 s apart and
    doubling up to 60 s; at the orphan timeout the agent stops with exit code 3 (refused, not cut off)."""
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, orphan_timeout=200.0)
        fake.token_hashes.clear()
        with pytest.raises(Orphaned) as orphaned:
            await agent.run()
        assert orphaned.value.exit_code == EXIT_TOKEN_REFUSED and "refused" in str(orphaned.value)
        refused = [t for t, _, what in events(fake) if what == "refused"]
        assert {what for _, _, what in events(fake) if what.startswith("join")} == {"join:token"}  # never the proof
        gaps = [round(b - a) for a, b in zip(refused, refused[1:], strict=False)]
        assert gaps[:4] == [1, 2, 4, 8] and max(gaps) <= 61, gaps
        assert 6 <= len(refused) <= 12 and agent.refusals == len(refused)
        assert TOKEN not in str(orphaned.value)


@on_mock_clock
async def test_a_machine_that_boots_before_its_fact_joins_once_the_fact_lands() -> None:
    """Refused while its token is not in any committed fact yet (the daemon was down), joined once it is."""
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        hashes = dict(fake.token_hashes)
        fake.token_hashes.clear()
        nursery.start_soon(agent.run)
        await trio.sleep(30)
        assert agent.joins == 0 and agent.refusals >= 3
        fake.token_hashes.update(hashes)  # the daemon is back and committed the fact
        await trio.sleep(35)
        assert agent.joins == 1 and agent.refusal == ""
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_an_unanswered_join_then_a_refused_token_tries_the_proof() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        fake.drop_after_join_frame = True  # the controller admits the token but the reply never arrives
        nursery.start_soon(agent.run)
        await trio.sleep(1)
        assert [(a, w) for _, a, w in fake.log] == [
            ("a:1", "connect"),
            ("a:1", "join:token"),  # admitted, but the reply is lost
            ("b:2", "connect"),
            ("b:2", "join:token"),
            ("b:2", "redirect"),
            ("a:1", "connect"),
            ("a:1", "join:token"),
            ("a:1", "refused"),  # spent by our own first join
            ("a:1", "connect"),
            ("a:1", "join:proof"),
        ]
        assert agent.joins == 1
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_without_rejoin_support_a_failover_leaves_the_agent_trying_until_the_orphan_timeout() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, orphan_timeout=120.0)
        fake.rejoin_supported = False

        async def fail_over_later() -> None:
            await trio.sleep(10)
            fake.fail_over()

        nursery.start_soon(fail_over_later)
        with pytest.raises(Orphaned) as orphaned:
            await agent.run()
        assert orphaned.value.exit_code == EXIT_TOKEN_REFUSED
        assert events(fake)[-3:-1] == [
            (events(fake)[-3][0], "b:2", "connect"),
            (events(fake)[-2][0], "b:2", "join:proof"),
        ]
        assert events(fake)[-1][2] == "refused" and agent.refusals >= 5
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_silent_controller_is_left_and_rejoined() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery)
        nursery.start_soon(agent.run)
        await trio.sleep(1)
        fake.mute = True  # heartbeats go unanswered from now on
        await trio.sleep(20)
        # Heard last at t=0 (the join). Beats at 5, 10, 15; at 20 the silence exceeds 15 s: reconnect at 20.2.
        assert fake.heartbeats == [5, 10, 15]
        assert [(t, w) for t, _, w in events(fake)][-2:] == [(20.2, "connect"), (20.2, "join:proof")]
        assert agent.joins == 2
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_join_that_hangs_times_out_and_moves_on() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, connect_timeout=3.0)
        fake.hang_joins = True
        nursery.start_soon(agent.run)
        await trio.sleep(3.1)
        fake.hang_joins = False
        await trio.sleep(1)
        # a hangs until the 3 s timeout; b (a standby) at 3.2 redirects to a, which now answers.
        assert [(t, a) for t, a, w in events(fake) if w == "connect"] == [(0, "a:1"), (3.2, "b:2"), (3.2, "a:1")]
        assert agent.joins == 1 and agent.connected_to == "a:1"
        nursery.cancel_scope.cancel()


def test_final_refusals_exit_with_code_4_and_an_orphan_timeout_says_whether_joins_were_refused() -> None:
    assert FINAL_REFUSALS == {"version_mismatch", "not_allowed"}
    assert JoinRefused("version_mismatch", "x").exit_code == EXIT_REFUSED
    assert Orphaned(300.0).exit_code == EXIT_ORPHANED
    assert Orphaned(300.0, "token_invalid: spent").exit_code == EXIT_TOKEN_REFUSED


@on_mock_clock
async def test_an_agent_cut_off_from_every_controller_gives_up_after_the_orphan_timeout() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, orphan_timeout=60.0)

        async def cut_off_later() -> None:
            await trio.sleep(102)  # joined at 0, heard every 5 s (heartbeat acks) until 100
            fake.down.update(ADDRS)
            fake.fail_over()

        nursery.start_soon(cut_off_later)
        with pytest.raises(Orphaned) as orphaned:
            await agent.run()
        # Last heard at 100 (the ack of the beat at 100): gives up at 160, while retrying every address.
        assert trio.current_time() == pytest.approx(160.0)
        assert orphaned.value.exit_code == EXIT_ORPHANED and orphaned.value.silence == pytest.approx(60.0)
        assert agent.joins >= 1 and fake.heartbeats[-1] == 100
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_an_agent_that_never_reaches_a_controller_gives_up_too_and_a_joined_one_never_does() -> None:
    async with trio.open_nursery() as nursery:
        fake, agent = make(nursery, orphan_timeout=30.0)
        fake.down.update(ADDRS)
        with pytest.raises(Orphaned):
            await agent.run()
        assert trio.current_time() == pytest.approx(30.0) and agent.joins == 0
        healthy, kept = make(nursery, orphan_timeout=15.0)  # = reply_timeout: the smallest allowed
        with trio.move_on_after(1000):
            await kept.run()
        assert kept.joins == 1  # acks every 5 s keep pushing the deadline on
        nursery.cancel_scope.cancel()


def test_the_orphan_timeout_is_at_least_the_reply_timeout() -> None:
    with pytest.raises(ValueError, match="orphan_timeout"):
        AgentConfig(ADDRS, REF, reply_timeout=15.0, orphan_timeout=10.0)
