"""Spot interruption and rebalance notices read from IMDSv2 (``agent.imds``, issue 34 item 4), on MockClock: the
token flow, the polling times, a notice reported to the controller in ``WorkerStatus`` at exact virtual times, and
a metadata service that fails or answers garbage costing the agent nothing."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import trio
from agent_fakes import FakeController
from test_agent_shell import ADDRS, REF, TOKEN, NoJitter, on_mock_clock

from provisionerd.agent import imds
from provisionerd.agent.worker import AgentConfig, WorkerAgent
from provisionerd.domain.model import HostStatus
from provisionerd.wire.messages import WorkerStatus

ACTION = b'{"action": "terminate", "time": "2026-12-05T20:02:00Z"}'
REBALANCE = b'{"noticeTime": "2026-12-05T20:00:00Z"}'
RECLAIM_AT = 1796500920.0  # 2026-12-05T20:02:00Z
REBALANCE_AT = 1796500800.0


class FakeImds:
    """IMDSv2 on trio's clock: the rebalance recommendation from ``rebalance_from``, the interruption notice from
    ``action_from`` (virtual seconds), each path 404 before; tokens expire after ``token_life``."""

    def __init__(self, action_from: float, rebalance_from: float, token_life: float = 1e9) -> None:
        self.action_from, self.rebalance_from, self.token_life = action_from, rebalance_from, token_life
        self.tokens: dict[str, float] = {}
        self.calls: list[tuple[float, str, str]] = []

    async def fetch(self, method: str, path: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        now = trio.current_time()
        self.calls.append((now, method, path))
        if method == "PUT" and path == imds.TOKEN_PATH:
            assert headers["X-aws-ec2-metadata-token-ttl-seconds"] == str(imds.TOKEN_TTL)
            token = f"tok{len(self.tokens)}"
            self.tokens[token] = now
            return 200, token.encode()
        issued = self.tokens.get(headers.get("X-aws-ec2-metadata-token", ""))
        if issued is None or now - issued >= self.token_life:
            return 401, b""
        if path == imds.INSTANCE_ACTION_PATH and now >= self.action_from:
            return 200, ACTION
        if path == imds.REBALANCE_PATH and now >= self.rebalance_from:
            return 200, REBALANCE
        return 404, b"<html>Not Found</html>"


def test_the_notices_parse_to_epoch_seconds_and_garbage_is_refused() -> None:
    assert imds.parse_instance_action(ACTION) == imds.Notices(reclaim_at=RECLAIM_AT, action="terminate")
    assert imds.parse_rebalance(REBALANCE) == imds.Notices(rebalance_at=REBALANCE_AT)
    for bad in (b"", b"[]", b'{"action": "terminate"}', b'{"action": "x", "time": "2026-12-05T20:02:00"}', b"\xff"):
        with pytest.raises(ValueError):
            imds.parse_instance_action(bad)
    with pytest.raises(ValueError):
        imds.http_fetch("https://169.254.169.254")


@on_mock_clock
async def test_the_notices_reach_the_controller_at_the_poll_after_they_appear() -> None:
    async with trio.open_nursery() as nursery:
        fake = FakeController(nursery, ADDRS)
        fake.allow(REF, TOKEN)
        agent = WorkerAgent(AgentConfig(ADDRS, REF), TOKEN, fake.connect, rng=NoJitter())
        service = FakeImds(action_from=32.0, rebalance_from=12.0, token_life=20.0)
        watch = imds.NoticeWatch(service.fetch, lambda n: agent.report_notice(n.reclaim_at, n.rebalance_at), 5.0)
        nursery.start_soon(agent.run)
        nursery.start_soon(watch.run)
        await trio.sleep(39)
        # Polls at 0, 5, 10, 15 (the rebalance recommendation, there since 12), ..., 35 (the interruption, since 32).
        assert [(t, r.reclaim_at, r.rebalance_at) for t, r in fake.reports] == [
            (0, 0.0, 0.0),
            (15, 0.0, REBALANCE_AT),
            (35, RECLAIM_AT, REBALANCE_AT),
        ]
        assert all(r.status is HostStatus.IDLE for _, r in fake.reports)
        # One token first; a 401 once it expired (at 20) fetched a new one and the read went on.
        puts = [t for t, method, _ in service.calls if method == "PUT"]
        assert puts == [0, 20]
        assert watch.failures == 0
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_rejoin_repeats_the_notice_and_a_later_zero_does_not_withdraw_it() -> None:
    async with trio.open_nursery() as nursery:
        fake = FakeController(nursery, ADDRS)
        fake.allow(REF, TOKEN)
        agent = WorkerAgent(AgentConfig(ADDRS, REF), TOKEN, fake.connect, rng=NoJitter())
        agent.report_notice(RECLAIM_AT, 0.0)  # before the join: in its first WorkerStatus
        nursery.start_soon(agent.run)
        await trio.sleep(1)
        agent.report_notice(0.0, 0.0)
        agent.set_status(HostStatus.BUSY)
        await trio.sleep(1)
        assert [(t, r) for t, r in fake.reports] == [
            (0, WorkerStatus(HostStatus.IDLE, RECLAIM_AT, 0.0)),
            (1, WorkerStatus(HostStatus.BUSY, RECLAIM_AT, 0.0)),
        ]
        with pytest.raises(ValueError):
            agent.report_notice(float("nan"), 0.0)
        nursery.cancel_scope.cancel()


@on_mock_clock
async def test_a_failing_or_garbled_metadata_service_is_logged_once_and_polled_again() -> None:
    answers = iter([OSError("connection refused")] * 3 + [(200, b"not json")] * 2 + [(404, b"")] * 100)
    calls: list[float] = []

    async def fetch(method: str, path: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        calls.append(trio.current_time())
        if method == "PUT":
            return 200, b"tok"
        answer = next(answers)
        if isinstance(answer, OSError):
            raise answer
        return answer

    reported: list[imds.Notices] = []
    watch = imds.NoticeWatch(fetch, reported.append, 5.0)
    with trio.move_on_after(31):
        await watch.run()
    assert watch.failures == 5
    assert reported == []
    assert sorted({t for t in calls}) == [0, 5, 10, 15, 20, 25, 30]
