"""The composition root: ``DaemonCore`` wires the daemon's pieces together and runs them.

``DaemonCore(config)`` builds the pieces with the one builder (``provisionerd.daemon.builder.build_pieces``: the
session, lease keepers, mutation gate, policy and executor, with every setting derived from the config there) and
adds what only a running daemon has: the offer feed, the reconcile loop (which reads ``core.session.view``), the
orphan cycles and the admin socket. ``await nursery.start(core.run)`` runs them until cancelled; then ``await
core.release_leases()`` gives every lease back (SIGTERM path).

The provisioning side: one provider client per configured provider (``daemon.clients.provider_clients``;
persistent plugins are supervised in ``run``) and every mutation through ``core.gate``. Tests may inject
``providers`` (e.g. in-memory fakes), a ``policy`` and the loop/executor settings.

What the daemon remembers of the controller is ``core.guard`` (``controller.amnesia_guard``): ``status()`` shows
it under ``controller`` (halted or not, the finding, the memory, the state file), and the admin socket's
``controller_accept_reset`` command (``provisionerd controller accept-reset``) is the admin's decision that ends a
halt.

The config: one holder, ``core.current`` (``daemon.current_config.CurrentConfig``), read by every part (the loop's
policy at every cycle, the orphan cycles, the admin's orphan actions, ``status``). ``core.reload()`` (``provisionerd
run`` calls it on SIGHUP) re-reads the config file and switches to it atomically when everything that changed
applies live, or keeps the running config entirely (``restart_needed``, ``failed``); ``status()`` shows the last
reload under ``reload``. Every admin request is guarded (``daemon.admin_guard``): a bad request or an unexpected
exception in handling one is a typed refusal, answered, logged and counted (``status()["admin"]``), never an
exception out of the daemon's nursery.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from provisionerd.config.loader import Config
from provisionerd.config.proofs import load_proven
from provisionerd.controller.history import HistoryNotServed, history_pages, recent_facts
from provisionerd.controller.session_settings import StreamFactory
from provisionerd.daemon.admin_guard import AdminRefusals
from provisionerd.daemon.admin_socket import AdminSocketCounts, Command, serve_admin_socket
from provisionerd.daemon.builder import Pieces, build_pieces
from provisionerd.daemon.clients import provider_clients, supervise
from provisionerd.daemon.current_config import NoReloadWatcher, ReloadResult, ReloadWatcher
from provisionerd.daemon.explain_admin import Explainer, Sources
from provisionerd.daemon.history_admin import history_command
from provisionerd.daemon.machines_admin import MachinesPager
from provisionerd.daemon.metered import CallLog, metered
from provisionerd.daemon.observability import Observability
from provisionerd.daemon.orphans import OrphanActions, report_command, run_orphan_cycles
from provisionerd.domain.errors import ConfigError, ControllerRejected, LinkDown
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.execution.loop import LoopSettings, ReconcileLoop
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.execution.orphan_cycle import OrphanCycle
from provisionerd.planner.cost import SpendFold, estimate
from provisionerd.planner.policy import Policy
from provisionerd.provider.client import ProviderClient
from provisionerd.telemetry.events import EventLog, ProcessInstance

log = logging.getLogger("provisionerd")

#: How long ``cost`` may read the controller's history (about 1 ms a page of 500 facts on a quiet link).
COST_TIMEOUT = 120.0

#: The reconcile loop's settings when none are given.
DEFAULT_LOOP_SETTINGS = LoopSettings()


class DaemonCore:
    def __init__(
        self,
        config: Config,
        *,
        connect: StreamFactory | None = None,
        events: EventLog | None = None,
        rng: random.Random | None = None,
        providers: Mapping[str, ProviderClient] | None = None,
        policy: Policy | None = None,
        loop_settings: LoopSettings = DEFAULT_LOOP_SETTINGS,
        executor_settings: ExecutorSettings | None = None,
        offer_interval: float = 60.0,
        wall: Callable[[], float] = time.time,
        instance: str = "",
        reload_watcher: ReloadWatcher | None = None,
    ) -> None:
        """``instance``: this start's ``Join.instance`` (empty: drawn from ``rng``; the simulation names its own,
        so that adding the field did not shift the draws every seeded run makes from ``rng``)."""
        if connect is None:
            from provisionerd.controller.connect import (
                tls_connector,
            )  # loads the TLS files now: a bad path fails at start

            connect = tls_connector(config)
        self._connect = connect
        rng = rng if rng is not None else random.Random()
        self.reload_watcher = reload_watcher if reload_watcher is not None else NoReloadWatcher()
        self.calls = CallLog()  # every provider call ends there (metrics, status): the clients are metered
        self.pieces: Pieces = build_pieces(
            config,
            connect=connect,
            events=events if events is not None else EventLog(config.daemon.events_log),
            rng=rng,
            providers=metered(providers if providers is not None else provider_clients(config), self.calls),
            instance=instance,
            policy=policy,
            executor_settings=executor_settings,
            wall=wall,
        )
        pieces = self.pieces
        self.events = pieces.events
        self.events.process = ProcessInstance.current(pieces.session.instance)  # the name the controller knows us by
        self.session = pieces.session
        self.ops = pieces.ops
        self.keepers = pieces.keepers
        self.gate = pieces.gate
        self.providers = pieces.providers
        self.current = pieces.current
        self.executor = pieces.executor
        self.wall = pieces.wall  # the clock of cloud launch times (the orphan cycles read it too)
        self.guard = pieces.guard
        self._keepers_nursery: trio.Nursery | None = None
        self.feed = OfferFeed(
            self.providers,
            self.events,
            interval=offer_interval,
            feedback=pieces.feedback.send,
            wall=wall,
        )
        self.loop = ReconcileLoop(
            self.session,
            self.keepers,
            self.executor,
            self.feed,
            lambda: self.current.policy,  # read at every cycle: a reload's new limits apply at the next one
            self.events,
            settings=loop_settings,
            wall=wall,
            jitter_seed=rng.randrange(1 << 30),
            view_ready=self.session.synced_for,
            feedback=pieces.feedback.receive,
            recent_facts=functools.partial(recent_facts, self.session),  # the health windows a restart lost
        )
        # ``provisionerd orphans adopt|return`` through the admin socket: decided and done with our own pieces.
        self.admin = AdminRefusals()
        self.admin_peers = AdminSocketCounts()  # who the socket accepted and refused (SO_PEERCRED)
        #: ``cost``'s fold of the controller's history and the incarnation it came from: the next report reads only
        #: the facts after it (the log only grows); one read at a time.
        self._spend: tuple[str, SpendFold] | None = None
        self._spend_lock = trio.Lock()
        self.orphan_actions = OrphanActions(pieces, refusals=self.admin)
        self.orphan_cycles: dict[str, OrphanCycle] = {}
        #: ``provisionerd machines``: pages of the live view with each machine's next planned action.
        self.machines = MachinesPager(
            lambda: self.session.view,
            lambda: self.loop.state,
            lambda: self.loop.policy,
            self.wall,
            rejoin=lambda: self.loop.rejoin,
            in_flight=self.loop.operations.in_flight,
        )
        #: ``provisionerd explain`` and ``plan --what-if``: the pure planner on the live inputs, and its reasons.
        self.explainer = Explainer(
            Sources(
                view=lambda: self.session.view,
                loop=self.loop,
                in_flight=self.loop.operations.in_flight,
                offers=lambda: [parsed.offer for parsed in self.feed.catalog.by_key.values()],
                leases=self.keepers,
                guard_status=self.guard.status,
                wall=self.wall,
                gang=lambda: self.loop.gang,
            )
        )
        self.observability = Observability(pieces, self.loop, self.feed, self.calls, self.status)

    @property
    def config(self) -> Config:
        """The running config (``current.config``): replaced only by a reload that applies as a whole."""
        return self.current.config

    @property
    def policy(self) -> Policy:
        """The planner policy in force (``current.policy``)."""
        return self.current.policy

    def reload(self, new: Config | None = None) -> ReloadResult:
        """Re-read the config file (or take ``new``) and switch to its live part atomically (``daemon.current_config``:
        what needs a restart is named and keeps its running value); emit the outcome (the event is the log line)
        and tell the ``reload_watcher`` (``provisionerd run``: systemd's RELOADING=1, then READY=1 with the result,
        and the log level). Never raises for a config it cannot use."""
        self.reload_watcher.reloading()
        result = self._reload(new)
        self.reload_watcher.reloaded(result, self.config)
        return result

    def _reload(self, new: Config | None) -> ReloadResult:
        if new is None:
            source = self.config.source
            try:
                new = (
                    load_proven(source) if source is not None else self.config
                )  # the config-check proofs gate a reload
            except ConfigError as exc:
                problems = list(exc.problems) or [str(exc)]
                self.events.emit("config_reload_failed", reason=exc.args[0].splitlines()[0], problems=problems)
                return self.current.refused(problems)
        result = self.current.reload(new)
        if result.outcome == "failed":
            self.events.emit(
                "config_reload_failed", problems=list(result.problems), restart_needed=list(result.restart_needed)
            )
            return result
        if result.outcome == "applied":  # the live settings outside the holder take effect (values already built)
            self._apply_orphan_settings(self.config)
            self.observability.listen_at(self.config.daemon.metrics_listen)
            self.loop.wake()  # plan with the new limits now
        # Each event is one line of the log (no second log call): the outcome at INFO, and what waits for a restart
        # at WARNING (telemetry.severity), so a log at ``warning`` still says a change did not take effect.
        self.events.emit(
            "config_reloaded",
            outcome=result.outcome,
            applied=list(result.applied),
            restart_needed=list(result.restart_needed),
        )
        if result.restart_needed:
            self.events.emit("config_restart_needed", fields=list(result.restart_needed))
        return result

    def _apply_orphan_settings(self, new: Config) -> None:
        """A reload's orphan settings: each cycle's policy, interval and settle window (values already built)."""
        for provider in new.providers:
            cycle = self.orphan_cycles.get(provider.name)
            if cycle is not None:
                cycle.policy = self.current.orphan_policy(provider.name)
                cycle.interval = provider.orphans.interval
            tracker = self.pieces.settle_trackers.get(provider.name)
            if tracker is not None:
                tracker.settle = provider.orphans.settle

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        leases = []
        for keeper in self.keepers.values():
            s = keeper.status(now)
            leases.append(
                {
                    "provider": s.provider,
                    "state": s.state.value,
                    "epoch": str(s.epoch) if s.epoch else None,
                    "remaining": None if s.remaining is None else round(s.remaining, 3),
                    "reason": s.reason,
                }
            )
        return {
            "cluster": self.config.cluster,
            "identity": self.config.identity,
            "process": self.events.process.as_field(),
            "link": self.session.status(),
            "leases": leases,
            "controller": {**self.guard.status(), "halted_refusals": self.gate.halted_refusals},
            "reconcile": {
                "cycles": self.loop.cycles,
                "busy_ops": len(self.executor.busy_ops),
                # Every op this process holds a record of, each with its stage (execution.op_book).
                "operations": self.executor.ops.describe(),
                "offers": len(self.feed.catalog),
                "provider_health": self.loop.provider_health(),
            },
            "reload": self.current.status(),
            "admin": {
                **self.admin.status(),
                "peers": {
                    "accepted": self.admin_peers.accepted,
                    "refused": dict(sorted(self.admin_peers.refused.items())),
                },
            },
            **self.observability.document(),  # per provider; demand, health, readiness (daemon.status_snapshot)
        }

    @property
    def reload_command(self) -> Command:
        """``provisionerd reload``: the same reload as SIGHUP, answered with its result (``ok``: the daemon
        answered; the outcome says whether the reload failed)."""

        async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
            log.info("reload asked through the admin socket by uid %s", peer_uid)
            return {"ok": True, "result": self.reload().to_json()}

        return Command(run=run, timeout=lambda _request: 30.0)

    @property
    def accept_reset(self) -> Command:
        """The admin's decision after controller amnesia (``provisionerd controller accept-reset``)."""
        return Command(run=self._accept_reset, timeout=lambda _request: 5.0)

    @property
    def cost(self) -> Command:
        """The estimated spend over the whole history of our providers (``provisionerd cost``): the controller's
        facts read page by page (``controller.history``) and priced as they come (``planner.cost.SpendFold``);
        ``{"scope": "live"}``: of the machines the view holds only (no controller read)."""
        return Command(run=self._cost, timeout=lambda _request: COST_TIMEOUT)

    async def _cost(self, request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
        if request.get("scope", "history") == "live":
            view = self.pieces.session.view
            if view is None:
                return {"ok": False, "error": "no view of the facts yet (not joined or not resynced)"}
            report = estimate(view.facts.machines.values(), self.wall())
            return {"ok": True, "at": self.wall(), "scope": "live", "cost": report.to_json()}
        if request.get("scope", "history") != "history":
            return {"ok": False, "error": "scope is 'history' (the default) or 'live'"}
        async with self._spend_lock:
            incarnation = self.session.incarnation
            kept = self._spend
            spend = kept[1] if kept is not None and incarnation and kept[0] == incarnation else SpendFold()
            before, pages = spend.facts, 0
            try:
                async for page in history_pages(self.session, after=spend.last_index):
                    spend.add_all(page.facts)
                    pages += 1
            except (LinkDown, ControllerRejected) as exc:
                log.info("cost: the controller's history could not be read: %s", exc)
                return {"ok": False, "error": f"cannot read the controller's history: {exc}"}
            except HistoryNotServed as exc:
                log.info("cost: %s", exc)
                return {"ok": False, "error": f"{exc}; 'provisionerd cost --live' prices the live fleet from the view"}
            finally:  # what was folded is a prefix of the log: the next read goes on from it (same incarnation)
                same = incarnation and self.session.incarnation == incarnation
                self._spend = (incarnation, spend) if same else None
        at = self.wall()
        return {
            "ok": True,
            "at": at,
            "scope": "history",
            "history": {
                "facts": spend.facts,
                "read_now": spend.facts - before,
                "pages": pages,
                "until_index": spend.last_index,
            },
            "cost": spend.report(at).to_json(),
        }

    async def _accept_reset(self, request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
        who = request.get("user")
        by = f"{who if isinstance(who, str) and who.isprintable() else '?'}"[:64] + f" (uid {peer_uid})"
        return self.guard.accept_reset(by)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. For a clean stop call ``release_leases`` first, while the link is still up."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.orphan_actions.run)
            await nursery.start(self.observability.serve)  # [daemon] metrics_listen: /metrics, /healthz, /readyz
            if self.config.daemon.admin_socket is not None:
                commands = {
                    "orphan_action": self.orphan_actions.command,
                    # provisionerd orphans --dry-run through the daemon: its running config, its clients
                    "orphans_report": report_command(lambda: self.config, self.providers, self._connect),
                    "controller_accept_reset": self.accept_reset,
                    "cost": self.cost,  # provisionerd cost (planner.cost, docs/fleet.md)
                    "history": history_command(self.session),  # provisionerd history (docs/protocol.md §6.6)
                    "machines": self.machines.command(),  # provisionerd machines (daemon.machines_admin)
                    "explain": self.explainer.explain_command(),  # provisionerd explain (daemon.explain_admin)
                    "plan_what_if": self.explainer.what_if_command(),  # provisionerd plan --what-if
                    "reload": self.reload_command,  # provisionerd reload (systemd's ExecReload=)
                }
                await nursery.start(
                    functools.partial(
                        serve_admin_socket,
                        self.config.daemon.admin_socket,
                        self.admin.guard_status(self.status),
                        {name: self.admin.guard(name, command) for name, command in commands.items()},
                        counts=self.admin_peers,
                        refusals=self.admin,
                        # the status pass off the loop for a large view: inline, 0.17-0.27 s at 100,000 machines
                        prepare=self.observability.snapshot.refresh,
                    )
                )
            await nursery.start(self.session.run)
            self._keepers_nursery = await nursery.start(self._run_keepers)
            await supervise(nursery, self.providers)
            # An unhealthy provider is read only by its probe (the loop's).
            await nursery.start(functools.partial(self.feed.run, skip=self.loop.unhealthy))
            await nursery.start(self.loop.run)
            # Orphan cycles (provisionerd.daemon.orphans): one per provider, every action through the executor.
            self.orphan_cycles = await nursery.start(run_orphan_cycles, self.pieces, self.loop)
            self.events.emit("daemon_started", identity=self.config.identity, providers=list(self.keepers))
            task_status.started()

    async def _run_keepers(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        async with trio.open_nursery() as nursery:
            for keeper in self.keepers.values():
                await nursery.start(keeper.run)
            task_status.started(nursery)

    async def release_leases(self, timeout: float = 3.0) -> None:  # noqa: ASYNC109 - each keeper's release bound
        """Stop the keepers (no more renewals or acquisitions), then stop all mutations and give every held lease
        back, concurrently, bounded by ``timeout``. Call it before cancelling ``run`` so the link is still up."""
        if self._keepers_nursery is not None:
            self._keepers_nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            for keeper in self.keepers.values():
                nursery.start_soon(keeper.release, timeout)
