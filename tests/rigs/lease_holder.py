"""A bare provisioner for tests: the daemon's own session, controller ops and lease keeper, and nothing else (no
reconciler, no orphan cycle), so a test can commit facts as the lease holder without anything acting on them."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator

import attrs
import trio

from provisionerd.config.loader import Config
from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.ops import ControllerOps
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import SessionSettings, StreamFactory
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.events import EventLog


@attrs.define(eq=False)
class Holder:
    session: ControllerSession
    ops: ControllerOps
    keeper: LeaseKeeper
    epoch: Epoch

    async def commit(self, *facts) -> list[int]:
        """Commit each fact stamped with the held epoch; their log indexes."""
        return [await self.ops.commit(attrs.evolve(fact, epoch=self.epoch)) for fact in facts]


@contextlib.asynccontextmanager
async def holding_lease(
    config: Config, provider: str, connect: StreamFactory | None = None, *, identity: str | None = None
) -> AsyncIterator[Holder]:
    """Join as ``identity`` (default: the config's), hold ``provider``'s lease, give it back on exit."""
    if connect is None:
        from provisionerd.controller.connect import tls_connector

        connect = tls_connector(config)
    events = EventLog()
    settings = SessionSettings.from_config(config)
    if identity is not None:
        settings = attrs.evolve(settings, identity=identity)
    session = ControllerSession(settings, connect, events, random.Random(1))
    ops = ControllerOps(session)
    keeper = LeaseKeeper(
        provider,
        ops,
        margin=config.lease.margin,
        backoff=config.controller.backoff,
        rng=random.Random(2),
        events=events,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        keeper_scope = trio.CancelScope()

        async def keep() -> None:
            with keeper_scope:
                await keeper.run()

        nursery.start_soon(keep)
        epoch = await keeper.wait_valid()
        try:
            yield Holder(session, ops, keeper, epoch)
        finally:
            keeper_scope.cancel()
            with trio.CancelScope(shield=True):
                await keeper.release(timeout=3.0)
            nursery.cancel_scope.cancel()
