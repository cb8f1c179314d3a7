"""What an operator reads from a running daemon besides its logs: metrics, health, readiness, per-provider status.

``Observability(pieces, loop, feed, calls)`` is built by the composition root (``DaemonCore``) after its pieces, and
joins three things that already exist without adding a call anywhere else:

- the status snapshot (``status_snapshot.StatusSnapshot``): ``document()`` is merged into ``DaemonCore.status()``;
- the metrics (``telemetry.metrics.DaemonMetrics``, a private registry): its gauges read ``status()`` at each
  scrape, its counters listen to the events stream (``EventLog.listeners``) and to the provider calls
  (``calls``, the ``CallLog`` the root's metered clients report to: ``provisionerd.daemon.metered``);
- the HTTP listener (``telemetry.metrics_http``) on ``[daemon] metrics_listen`` (none: no listener): ``/metrics``
  (rendered at most once per ``METRICS_MIN_INTERVAL`` second),
  ``/healthz`` (200 while the reconcile loop turns, else 503) and ``/readyz`` (200 once joined, resynced and every
  lease held or on standby, else 503, with the reasons in the body).
"""

from __future__ import annotations

import json
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
        self.metrics = DaemonMetrics(status)
        calls.sinks.append(self.metrics.provider_call)
        pieces.events.listeners.append(self.metrics.on_event)
        self.server = HttpServer(
            {"/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz},
            on_refusal=self.metrics.http_refused,
        )
        self.address: tuple[str, int] | None = None  # where the listener is bound (None: not listening)
        self._rendered: tuple[float, bytes] | None = None  # (trio time, text) of the last /metrics rendering

    def document(self) -> dict[str, Any]:
        return self.snapshot.document()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``[daemon] metrics_listen`` until cancelled (without one, only note the start and return).

        Raises:
            ConfigError: the address cannot be listened on (in use, or not this host's).
        """
        self.snapshot.mark_started()
        address = self.pieces.config.daemon.metrics_listen
        if address is None:
            task_status.started()
            return
        try:
            listeners = await open_http_listeners(address)
        except OSError as exc:  # in use, not an address of this host: the daemon does not start
            problem = f"daemon.metrics_listen: cannot listen on {address!r}: {exc.strerror or exc}"
            raise ConfigError("cannot start the metrics listener", [problem]) from None
        async with trio.open_nursery() as nursery:
            self.address = await nursery.start(serve_listeners, listeners, self.server)
            task_status.started()

    def _metrics(self) -> Response:
        # A scrape reads the whole fleet once (status_snapshot: ~1-2 us per machine): scrapes within
        # ``METRICS_MIN_INTERVAL`` get the same text, so a client scraping in a loop cannot take the event loop.
        now = trio.current_time()
        if self._rendered is None or now - self._rendered[0] >= METRICS_MIN_INTERVAL:
            self._rendered = (now, self.metrics.render())
        return Response(200, self._rendered[1], CONTENT_TYPE_LATEST)

    def _healthz(self) -> Response:
        live, detail = self.snapshot.live(trio.current_time())
        return Response(200 if live else 503, f"{'ok' if live else 'unhealthy'}: {detail}\n".encode())

    def _readyz(self) -> Response:
        ok, reasons = self.snapshot.ready(trio.current_time())
        body = json.dumps({"ready": ok, "reasons": reasons}, sort_keys=True) + "\n"
        return Response(200 if ok else 503, body.encode(), "application/json")
