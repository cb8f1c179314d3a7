"""The orphan side of the running daemon: its orphan cycles, and the admin's explicit actions on one finding.

``run_orphan_cycles(pieces)`` runs the cycles the daemon's builder makes (``Pieces.orphan_cycles``: one
:class:`~provisionerd.execution.orphan_cycle.OrphanCycle` per configured provider that has a client, each reading
the daemon's own session and that provider's lease keeper and acting only through the executor). The cycles share
nothing but the events log. A cycle lists nothing (its ``orphan_pass`` event says ``skipped: {"unhealthy": ...}``
or ``skipped: {"standby": ...}`` and ``listed: false``; ``OrphanCycle.last_skip`` and ``skipped`` count them) while
its provider is unhealthy in a way that refuses returns too (``auth_failed``, ``invalid_request``: the reconcile
loop's probe alone decides when it is healthy again; a ``quota_exceeded`` provider is still listed, as the loop
still polls its reclaims: returning an orphan frees quota), while this daemon is a standby for it (the
controller refused its lease as ``held``: the holder's cycle does the work), or while the controller's view cannot be
read (``skipped: {"view_unreadable": ...}``: the link is not up, or its view predates the provider's lease grant).
A pass without the view could tell no machine apart and would act on nothing, so its listing would be wasted: at
100,000 machines about a second of CPU and 100 MB held, and at start, while the first resync builds the view, the
two made the daemon's resident set 207 MB four seconds after start, 153 MB without the listing (bench/steady.py).
The pass still reads the view after its listing, as ``Observation`` requires: a link that breaks during the
listing is seen then.

``OrphanActions`` answers the admin socket's ``orphan_action`` command (``provisionerd orphans adopt|return``
while the daemon runs): the admin's explicit action, decided and carried out by
``provisionerd.daemon.orphan_admin.decide_and_act`` with the daemon's own session view, lease keeper and executor
(``Pieces.actor``: so through the daemon's gate, under its epoch, intent first) and audited in the daemon's events
log. One action at a time per machine (a second request for it is answered ``busy``) and at most ``max_running``
at once. Each action runs in the daemon's own nursery, not in the socket request: a client that gives up, or a
request that outlives its bound (``orphan_admin.action_timeout``: the socket then answers ``pending``), never
cuts a provider call or a return short; it finishes and is audited.

``report_command`` answers the admin socket's ``orphans_report`` command (``provisionerd orphans --dry-run
--socket PATH``, or ``--config FILE`` naming a file that no longer loads): the dry-run report
(``daemon.orphan_report.dry_run``) made by the daemon with its running config and its own provider clients
(read-only there), so it works while the file on disk is broken.

Every request reads the running config through the one holder (``Pieces.current``), so after a reload that needs a
restart it still decides with the config the rest of the daemon runs on. Every refusal is typed (``refused``:
``bad_request``, ``unknown_provider``, ``busy``, ``not_ready``, ``internal_error``), logged and counted
(``daemon.admin_guard.AdminRefusals``); an unexpected exception while deciding or acting is the refusal
``internal_error``, never an exception out of the actions' nursery (the daemon's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import trio

from provisionerd.config.loader import Config
from provisionerd.controller.session_settings import StreamFactory
from provisionerd.daemon.admin_guard import AdminRefusals
from provisionerd.daemon.admin_socket import Command
from provisionerd.daemon.builder import Pieces
from provisionerd.daemon.orphan_admin import AdminRequest, AdminResult, action_timeout, decide_and_act
from provisionerd.daemon.orphan_report import dry_run
from provisionerd.daemon.status_snapshot import standby
from provisionerd.domain.errors import ProtocolError
from provisionerd.execution.loop import ReconcileLoop
from provisionerd.execution.orphan_cycle import OrphanCycle
from provisionerd.execution.orphan_reads import session_unreadable
from provisionerd.orphans.report import render_table, report_document
from provisionerd.provider.client import ProviderClient

#: Seconds the ``orphans_report`` command waits for the controller at most (a request may ask for less).
REPORT_TIMEOUT = 30.0

#: Why a cycle skips its pass (``OrphanCycle.run``'s ``skip``): the detail of each reason.
STANDBY_DETAIL = "another daemon holds this provider's lease (the controller refused it as held); its cycle lists"


def skip_reason(pieces: Pieces, loop: ReconcileLoop | None, provider: str) -> tuple[str, str] | None:
    """``("standby", ...)``, ``("unhealthy", "<code>: ...")``, ``("view_unreadable", <why>)`` or ``None`` (run the
    pass): see the module docstring."""
    if standby(pieces.keepers[provider]):
        return ("standby", STANDBY_DETAIL)
    entry = None if loop is None else loop.state.capacity.unhealthy.get(provider)
    if entry is not None and entry.blocks_returns:
        return ("unhealthy", f"{entry.code}: nothing is asked of it until the reconcile loop's probe succeeds")
    why = session_unreadable(pieces.session, provider)
    if why is not None:
        return ("view_unreadable", why)
    return None


async def run_orphan_cycles(
    pieces: Pieces,
    loop: ReconcileLoop | None = None,
    *,
    task_status: trio.TaskStatus[dict[str, OrphanCycle]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the orphan cycles of ``pieces`` until cancelled; hands them to ``task_status`` (for status and tests).
    ``loop``: the reconcile loop whose provider health the cycles follow (``skip_reason``)."""
    cycles = pieces.orphan_cycles()
    async with trio.open_nursery() as nursery:
        for name, (cycle, interval) in cycles.items():
            skip = functools.partial(skip_reason, pieces, loop, name)
            await nursery.start(functools.partial(cycle.run, interval, skip=skip))
        task_status.started({name: cycle for name, (cycle, _) in cycles.items()})


class OrphanActions:
    """The daemon's side of ``provisionerd orphans adopt|return`` (see the module docstring). ``run`` it in the
    daemon's nursery; hand ``command`` to the admin socket as ``orphan_action``."""

    def __init__(self, pieces: Pieces, *, max_running: int = 4, refusals: AdminRefusals | None = None) -> None:
        self._pieces = pieces
        self.refusals = refusals if refusals is not None else AdminRefusals()
        self._max_running = max_running
        self._nursery: trio.Nursery | None = None
        self.running: set[tuple[str, str]] = set()  # (provider, machine_id) of each action under way

    @property
    def command(self) -> Command:
        return Command(self.handle, self.timeout_for)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery the actions run in, until cancelled (which cancels any action under way)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def timeout_for(self, request: Mapping[str, Any]) -> float:
        """The socket's bound for ``request``: ``action_timeout`` of its provider (a bad request answers at once)."""
        provider, config = request.get("provider"), self._pieces.config
        if isinstance(provider, str) and provider in config.provider_names:
            return action_timeout(config, provider)
        return 5.0

    async def handle(self, document: dict[str, Any], peer_uid: int | None = None) -> dict[str, Any]:
        """Answer one ``orphan_action`` request: ``{"ok", "result": AdminResult}`` when decided (and done),
        ``{"ok": false, "error"}`` for a bad request, ``{"ok": false, "busy": true, "error"}`` while that machine
        (or ``max_running`` machines) has an action under way."""
        refuse = self.refusals.refuse
        try:
            request = AdminRequest.from_json(document)
        except ProtocolError as exc:
            return refuse("bad_request", str(exc))
        pieces = self._pieces
        config = pieces.config  # the running config, read once for the whole request
        if (
            request.provider not in pieces.providers
            or request.provider not in pieces.keepers
            or request.provider not in config.provider_names
        ):
            return refuse("unknown_provider", f"this daemon has no provider named {request.provider!r}")
        key = (request.provider, request.machine_id)
        if key in self.running:
            return refuse(
                "busy",
                f"busy: an action on machine {request.machine_id!r} of "
                f"provider {request.provider!r} is under way; try again",
                busy=True,
            )
        if len(self.running) >= self._max_running:
            return refuse("busy", f"busy: {len(self.running)} orphan actions are under way", busy=True)
        if self._nursery is None:
            return refuse("not_ready", "the daemon is not ready for orphan actions (starting or stopping)")
        actor = pieces.actor(request.provider, via="daemon", witness={} if peer_uid is None else {"uid": peer_uid})
        done = trio.Event()
        box: list[AdminResult | dict[str, Any]] = []

        async def one() -> None:
            try:
                box.append(await decide_and_act(config, request, actor))
            except Exception as exc:  # noqa: BLE001 - runs in the daemon's nursery: nothing may escape it
                box.append(self.refusals.internal("orphan_action", exc))
            finally:
                self.running.discard(key)
                done.set()

        self.running.add(key)
        self._nursery.start_soon(one)
        await done.wait()
        if not box:  # cancelled: the daemon is stopping
            return refuse("not_ready", "the daemon stopped before the action finished")
        if isinstance(box[0], dict):
            return box[0]
        return {"ok": box[0].ok, "result": box[0].to_json()}


def report_command(
    config: Callable[[], Config], clients: Mapping[str, ProviderClient], connect: StreamFactory
) -> Command:
    """The ``orphans_report`` admin command (module docstring): ``{"providers": [...], "timeout": s}`` in;
    ``{"ok": true, "report": <the --json document>, "table": <the table>, "unreadable": [...]}`` out."""

    def timeout_of(request: Mapping[str, Any]) -> float:
        wanted = request.get("timeout")
        if isinstance(wanted, (int, float)) and not isinstance(wanted, bool) and 0 < wanted <= REPORT_TIMEOUT:
            return float(wanted)
        return REPORT_TIMEOUT

    async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
        running = config()
        names = request.get("providers") or []
        if not isinstance(names, list) or not all(isinstance(n, str) and n in running.provider_names for n in names):
            return {"ok": False, "error": f"providers: each one of {', '.join(running.provider_names)}"}
        report = await dry_run(running, providers=names, clients=clients, connect=connect, timeout=timeout_of(request))
        document = report_document(report.findings, report.mutations, report.invisible, report.unknown_outcomes)
        return {
            "ok": True,
            "report": document,
            "table": render_table(
                report.findings, report.mutations, invisible=report.invisible, unknown=report.unknown_outcomes
            ),
            "unreadable": list(report.unreadable),
        }

    return Command(run=run, timeout=lambda request: timeout_of(request) + 15.0)
