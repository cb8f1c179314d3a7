"""A tiny HTTP/1.1 server on trio for ``GET /metrics``, ``/healthz`` and ``/readyz``: bounded, one request each.

Not prometheus_client's threaded server: everything here runs in the daemon's trio loop, so a scrape reads the
daemon's state between two of its steps (no lock, no torn read), and ``/healthz`` answering at all proves the loop
turns. ``serve_http(address, routes, ...)`` listens on ``host:port`` (``[::1]:port`` for IPv6; port 0 picks one:
``task_status.started`` gets the bound ``(host, port)``) and answers each connection once, then closes it.

Bounds, because anyone who can reach the port can send anything:

- the request head (request line and headers) is at most ``max_request`` bytes (431 past it); a body is never read;
- the whole head must arrive within ``read_timeout`` seconds (trio's clock), else the connection is closed (408);
- at most ``max_connections`` connections at once; one more is answered 503 and closed at once;
- only ``GET`` and ``HEAD`` (405), only the routes given (404), ``HTTP/1.0`` or ``HTTP/1.1`` (400);
- a response is sent within ``write_timeout`` seconds, or the connection is dropped.

Every refusal is counted (``refusals.http_refused(reason)``: a ``RefusalCounter`` given at construction, the
daemon's registry with its ``provisionerd_http_refusals_total`` counter) and logged (the
first of each reason at INFO, the rest at DEBUG: a scanner must not fill the log).

A route is a function ``() -> Response`` called in the trio loop; it must be quick (the metrics collector reads the
state snapshot in one pass).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import attrs
import trio

log = logging.getLogger(__name__)

MAX_REQUEST = 8192
READ_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0
MAX_CONNECTIONS = 16

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


@attrs.frozen
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as ``(host, port)``; ``ValueError`` naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics address must look like host:port, not {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _head(status: int, content_type: str, length: int) -> bytes:
    return (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {length}\r\nConnection: close\r\n"
        "Cache-Control: no-store\r\n\r\n"
    ).encode("ascii")


class RefusalCounter(Protocol):
    """Who counts the listener's refusals (``telemetry.metrics.DaemonMetrics``)."""

    def http_refused(self, reason: str) -> None: ...


class _Uncounted:
    def http_refused(self, reason: str) -> None:
        pass


class HttpServer:
    """The connection handler (see the module docstring); ``serve_http`` runs it on a listener."""

    def __init__(
        self,
        routes: Mapping[str, Callable[[], Response | Awaitable[Response]]],
        *,
        refusals: RefusalCounter | None = None,
        max_request: int = MAX_REQUEST,
        read_timeout: float = READ_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.routes = dict(routes)
        self._refusals = refusals if refusals is not None else _Uncounted()
        self.max_request = max_request
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.limiter = trio.CapacityLimiter(max_connections)
        self.served = 0
        self._logged: set[str] = set()

    def _refuse(self, reason: str, detail: str) -> None:
        self._refusals.http_refused(reason)
        level = logging.DEBUG if reason in self._logged else logging.INFO
        self._logged.add(reason)
        log.log(level, "metrics listener refused a request (%s): %s", reason, detail)

    async def handle(self, stream: trio.abc.Stream) -> None:
        try:
            try:
                self.limiter.acquire_nowait()
            except trio.WouldBlock:
                self._refuse("busy", "too many connections")
                await self._send(stream, Response(503, b"busy\n"))
                return
            try:
                response = await self._answer(stream)
                if response is not None:
                    await self._send(stream, response)
            finally:
                self.limiter.release()
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.abc.Stream) -> Response | None:
        data = b""
        with trio.move_on_after(self.read_timeout) as scope:
            while b"\r\n\r\n" not in data and b"\n\n" not in data:
                if len(data) > self.max_request:
                    break
                try:
                    chunk = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    return None
                if not chunk:
                    self._refuse("bad_request", "connection closed before the request ended")
                    return None
                data += chunk
        if scope.cancelled_caught:
            self._refuse("timeout", f"no complete request within {self.read_timeout:g}s")
            return Response(408, b"request timeout\n")
        end = data.find(b"\r\n\r\n")
        head = data[: end if end >= 0 else data.find(b"\n\n")]
        if len(head) > self.max_request:
            self._refuse("too_large", f"request head over {self.max_request} bytes")
            return Response(431, b"request too large\n")
        line = head.split(b"\n", 1)[0].rstrip(b"\r")
        parts = line.split(b" ")
        if len(parts) != 3 or parts[2] not in (b"HTTP/1.0", b"HTTP/1.1"):
            self._refuse("bad_request", f"request line {line[:80]!r}")
            return Response(400, b"bad request\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            self._refuse("method", f"method {method[:16]!r}")
            return Response(405, b"only GET\n")
        route = self.routes.get(target.decode("ascii", "replace"))
        if route is None:
            self._refuse("not_found", f"path {target[:80]!r}")
            return Response(404, b"not found\n")
        answer = route()  # a route may await what it reads (the daemon's /metrics: its status pass, off the loop)
        response = await answer if inspect.isawaitable(answer) else answer
        self.served += 1
        return response if method == b"GET" else attrs.evolve(response, body=b"")

    async def _send(self, stream: trio.abc.Stream, response: Response) -> None:
        with trio.move_on_after(self.write_timeout):
            try:
                await stream.send_all(_head(response.status, response.content_type, len(response.body)) + response.body)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


async def open_http_listeners(address: str) -> list[trio.SocketListener]:
    """The listeners of ``address`` (``OSError`` when it cannot be listened on; ``ValueError`` for no address)."""
    host, port = parse_address(address)
    return await trio.open_tcp_listeners(port, host=host)


async def serve_http(
    address: str,
    server: HttpServer,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``address`` and serve ``server`` until cancelled; ``task_status.started((host, port))``. Raises
    ``OSError`` before it starts when the address cannot be listened on."""
    await serve_listeners(await open_http_listeners(address), server, task_status=task_status)


async def serve_listeners(
    listeners: list[trio.SocketListener],
    server: HttpServer,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server`` on ``listeners`` (``open_http_listeners``) until cancelled."""
    host, port = listeners[0].socket.getsockname()[:2]
    log.info("metrics and health on %s port %s (/metrics, /healthz, /readyz)", host, port)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, server.handle, listeners)
        task_status.started((str(host), int(port)))
