"""The daemon's controller side wired together: session, lease keepers, mutation gate, admin socket, events.

``DaemonCore(config)`` builds the pieces; ``await nursery.start(core.run)`` runs them until cancelled; then
``await core.release_leases()`` gives every lease back (SIGTERM path). The reconciler and the provider runtime are
not wired here yet: they will read ``core.session.view`` and pass every mutation through ``core.gate``.
"""

from __future__ import annotations

import random
from typing import Any

import trio

from provisionerd.admin_socket import serve_admin_socket
from provisionerd.config import Config
from provisionerd.controller_ops import ControllerOps
from provisionerd.events import EventLog
from provisionerd.gate import MutationGate
from provisionerd.lease import LeaseKeeper
from provisionerd.session import ControllerSession, SessionSettings, StreamFactory


class DaemonCore:
    def __init__(
        self,
        config: Config,
        *,
        connect: StreamFactory | None = None,
        events: EventLog | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if connect is None:
            from provisionerd.connect import tls_connector  # loads the TLS files now: a bad path fails at start

            connect = tls_connector(config)
        self.config = config
        self.events = events if events is not None else EventLog(config.daemon.events_log)
        rng = rng if rng is not None else random.Random()
        self.session = ControllerSession(SessionSettings.from_config(config), connect, self.events, rng)
        self.ops = ControllerOps(self.session)
        self.keepers = {
            p.name: LeaseKeeper(p.name, self.ops, margin=config.lease.margin, backoff=config.controller.backoff,
                                rng=rng, events=self.events)
            for p in config.providers
        }
        self.gate = MutationGate(self.keepers, self.ops, self.events)
        self._keepers_nursery: trio.Nursery | None = None
        # A new primary may not know our leases: confirm them at once instead of at the next scheduled renewal.
        self.session.on_resync.append(lambda _view: [k.renew_now() for k in self.keepers.values()])

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        leases = []
        for keeper in self.keepers.values():
            s = keeper.status(now)
            leases.append({
                "provider": s.provider, "state": s.state.value, "epoch": str(s.epoch) if s.epoch else None,
                "remaining": None if s.remaining is None else round(s.remaining, 3), "reason": s.reason,
            })  # fmt: skip
        return {"cluster": self.config.cluster, "identity": self.config.identity, "link": self.session.status(),
                "leases": leases}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. For a clean stop call ``release_leases`` first, while the link is still up."""
        async with trio.open_nursery() as nursery:
            if self.config.daemon.admin_socket is not None:
                await nursery.start(serve_admin_socket, self.config.daemon.admin_socket, self.status)
            await nursery.start(self.session.run)
            self._keepers_nursery = await nursery.start(self._run_keepers)
            self.events.emit("daemon_started", identity=self.config.identity, providers=list(self.keepers))
            task_status.started()

    async def _run_keepers(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        async with trio.open_nursery() as nursery:
            for keeper in self.keepers.values():
                await nursery.start(keeper.run)
            task_status.started(nursery)

    async def release_leases(self, timeout: float = 3.0) -> None:
        """Stop the keepers (no more renewals or acquisitions), then stop all mutations and give every held lease
        back, concurrently, bounded by ``timeout``. Call it before cancelling ``run`` so the link is still up."""
        if self._keepers_nursery is not None:
            self._keepers_nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            for keeper in self.keepers.values():
                nursery.start_soon(keeper.release, timeout)
