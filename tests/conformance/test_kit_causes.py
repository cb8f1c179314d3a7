"""The controller kit's FAILs name their cause (issue 33), and its waits keep a connection alive: against the
reference controller in this process, on loopback sockets, with a short heartbeat timeout."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from provisionerd.conformance import peer as peer_module
from provisionerd.conformance.context import IDENTITY, Context, KitOptions
from provisionerd.conformance.peer import Connector, join_primary
from provisionerd.conformance.results import CheckFailed
from provisionerd.domain.model import Role
from provisionerd.wire.messages import Heartbeat, HeartbeatAck, Join
from refcontroller.api import open_refcontroller
from refcontroller.server import Timeouts

pytestmark = pytest.mark.process  # real sockets on the real clock (the controller runs in this process)

#: The controller drops a peer silent this long; the kit heartbeats every ``BEAT`` while it waits.
SILENCE, BEAT = 1.0, 0.25


async def _with_controller(certs: Path, data: Path, body) -> str:
    async with open_refcontroller(
        certs, data, replicas=1, lease_ttl=3.0, check_interval=0.5, timeouts=Timeouts(heartbeat=SILENCE)
    ) as ctl:
        ctx = Context(Connector(certs), ctl.addresses, KitOptions())
        with trio.fail_after(30):
            try:
                return str(await body(ctx))
            finally:
                await ctx.cleanup()


@pytest.fixture(autouse=True)
def _short_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_module, "HEARTBEAT_EVERY", BEAT)


def test_a_wait_longer_than_the_heartbeat_timeout_keeps_the_connection(certs: Path, tmp_path: Path) -> None:
    async def body(ctx: Context) -> str:
        peer, _ = await ctx.provisioner([ctx.provider("alive")])
        await peer.keep_alive(3 * SILENCE)
        ack = await peer.request(Heartbeat(99))
        assert isinstance(ack, HeartbeatAck) and ack.seq == 99
        silent, _ = await ctx.provisioner([ctx.provider("silent")])
        await trio.sleep(3 * SILENCE)  # what the kit did before: the controller drops the silent one
        with pytest.raises(CheckFailed) as dropped:
            await silent.request(Heartbeat(1))
        return str(dropped.value)

    said = trio.run(_with_controller, certs, tmp_path / "data", body)
    assert said.startswith("the provisioner connection to 127.0.0.1:") or said.startswith("the controller closed"), said
    assert "the kit had sent nothing on it for 3." in said and "heartbeat timeout" in said, said


def test_a_refused_worker_join_says_it_was_refused_and_why(certs: Path, tmp_path: Path) -> None:
    async def body(ctx: Context) -> str:
        tokens = await ctx.worker_tokens("refused", 1)
        msg = Join(Role.WORKER, IDENTITY, instance_ref=tokens.refs[0], token="not-the-token-" + "x" * 20)
        with pytest.raises(CheckFailed) as refused:
            await join_primary(ctx.connector, ctx.addresses, msg)
        return str(refused.value)

    said = trio.run(_with_controller, certs, tmp_path / "data", body)
    assert said.startswith("no replica accepted the worker's Join: 127.0.0.1:"), said
    assert "refused with errorMsg token_invalid" in said and "no committed fact gives this token" in said, said


def test_a_connection_left_open_is_named_with_the_limit(certs: Path, tmp_path: Path) -> None:
    async def body(ctx: Context) -> str:
        peer, _ = await ctx.provisioner([ctx.provider("open")])
        with pytest.raises(CheckFailed) as still:
            await peer.closing(0.3, "the holder's connection to the old primary")
        return str(still.value)

    said = trio.run(_with_controller, certs, tmp_path / "data", body)
    assert (
        said
        == "the holder's connection to the old primary was still open after 0.3s (the limit: it must close within 0.3s)"
    )
