"""What an operator reads from a running daemon besides its logs: metrics, health, readiness, per-provider status.

``Observability(pieces, loop, feed, calls)`` is built by the composition root (``DaemonCore``) after its pieces, and
joins three things that already exist without adding a call anywhere else:

- the status snapshot (``status_snapshot.StatusSnapshot``): ``document()`` is merged into ``DaemonCore.status()``;
- the metrics (``telemetry.metrics.DaemonMetrics``, a private registry): its gauges read ``status()`` at each
  scrape; its counters are the ones the events log owns (``EventLog.counters``: every record is counted as it is
  written) and the ones the provider calls' log owns (``CallLog.counters``: the log the root's metered clients
  report to, ``provisionerd.daemon.metered``); the listener's refusals are counted by the registry itself, given
  to the ``HttpServer`` at construction;
- the HTTP listener (``telemetry.metrics_http``) on ``[daemon] metrics_listen`` (none: no listener): ``/metrics``
  (rendered at most once per ``METRICS_MIN_INTERVAL`` second),
  ``/healthz`` (200 while the reconcile loop turns, else 503) and ``/readyz`` (200 once joined, resynced and every
  lease held or on standby, else 503, with the reasons in the body).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from provisionerd.daemon.builder import Pieces
from provisionerd.daemon.metered import CallLog
from provisionerd.daemon.status_snapshot import StatusSnapshot
from provisionerd.domain.errors import ConfigError
from provisionerd.execution.loop import ReconcileLoop
from provisionerd.execution.offer_feed import OfferFeed
from provisionerd.telemetry.metrics import DaemonMetrics
from provisionerd.telemetry.metrics_http import HttpServer, Response, open_http_listeners, serve_listeners

log = logging.getLogger(__name__)

#: Seconds a /metrics rendering is served again before the state is read anew.
METRICS_MIN_INTERVAL = 1.0


class Observability:
    """See the module docstring. ``status``: the daemon's whole status document (what the gauges read)."""

    def __init__(
        self,
        pieces: Pieces,
        loop: ReconcileLoop,
        feed: OfferFeed,
        calls: CallLog,
        status: Callable[[], Mapping[str, Any]],
    ) -> None:
        self.pieces = pieces
        self.snapshot = StatusSnapshot(pieces, loop, feed, calls)
        # The counters the events log and the call log own, exported here (nothing is handed a callback).
        self.metrics = DaemonMetrics(status, events=pieces.events.counters, calls=calls.counters)
        self.server = HttpServer(
            {"/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz},
            refusals=self.metrics,
        )
        self.address: tuple[str, int] | None = None  # where the listener is bound (None: not listening)
        self._rendered: tuple[float, bytes] | None = None  # (trio time, text) of the last /metrics rendering
        self._wanted: str | None = None  # the address the running config names
        self._moved = trio.Event()  # set by ``listen_at`` when a reload names another one

    def document(self) -> dict[str, Any]:
        return self.snapshot.document()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``[daemon] metrics_listen`` until cancelled, moving to another address when a reload names one
        (``listen_at``; none: no listener).

        Raises:
            ConfigError: at start, the address cannot be listened on (in use, or not this host's). After a reload
                such an address is logged (ERROR) and emitted (``metrics_listen_failed``), and the listener stays
                where it was.
        """
        self.snapshot.mark_started()
        self._wanted = self.pieces.config.daemon.metrics_listen
        listeners = await self._open(self._wanted)
        task_status.started()
        async with trio.open_nursery() as nursery:
            scope = await self._serve_on(nursery, listeners)
            while True:
                await self._moved.wait()
                self._moved = trio.Event()
                try:
                    listeners = await self._open(self._wanted)
                except ConfigError as exc:
                    log.error("%s; the metrics listener stays at %s", "; ".join(exc.problems), self.address)
                    self.pieces.events.emit("metrics_listen_failed", problems=list(exc.problems))
                    continue
                scope.cancel()  # the old listener closes once the new one is bound
                scope = await self._serve_on(nursery, listeners)

    def listen_at(self, address: str | None) -> None:
        """A reload's ``on_applied`` hook: move the listener to ``address`` (cannot fail here; ``serve`` binds it)."""
        if address != self._wanted:
            self._wanted = address
            self._moved.set()

    async def _open(self, address: str | None) -> list[trio.SocketListener] | None:
        if address is None:
            return None
        try:
            return await open_http_listeners(address)
        except OSError as exc:  # in use, not an address of this host
            problem = f"daemon.metrics_listen: cannot listen on {address!r}: {exc.strerror or exc}"
            raise ConfigError("cannot start the metrics listener", [problem]) from None

    async def _serve_on(self, nursery: trio.Nursery, listeners: list[trio.SocketListener] | None) -> trio.CancelScope:
        """Serve on ``listeners`` in ``nursery`` under a scope of its own (cancel it to close them)."""
        if listeners is None:
            self.address = None
            return trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as inner:
                    self.address = await inner.start(serve_listeners, listeners, self.server)
                    task_status.started(scope)

        scope: trio.CancelScope = await nursery.start(run)
        return scope

    async def _metrics(self) -> Response:
        # A scrape reads the whole fleet once (status_snapshot: ~1-2 us per machine, off the loop for a large view:
        # ``StatusSnapshot.refresh``): scrapes within ``METRICS_MIN_INTERVAL`` get the same text, so a client
        # scraping in a loop cannot take the event loop.
        if self._rendered is None or trio.current_time() - self._rendered[0] >= METRICS_MIN_INTERVAL:
            await self.snapshot.refresh()
            self._rendered = (trio.current_time(), self.metrics.render())
        return Response(200, self._rendered[1], CONTENT_TYPE_LATEST)

    def _healthz(self) -> Response:
        live, detail = self.snapshot.live(trio.current_time())
        return Response(200 if live else 503, f"{'ok' if live else 'unhealthy'}: {detail}\n".encode())

    def _readyz(self) -> Response:
        ok, reasons = self.snapshot.ready(trio.current_time())
        body = json.dumps({"ready": ok, "reasons": reasons}, sort_keys=True) + "\n"
        return Response(200 if ok else 503, body.encode(), "application/json")
