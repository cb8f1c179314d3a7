"""A loopback HTTP proxy in front of the emulator that answers EC2 errors for chosen calls, like EC2 would.

moto raises no capacity errors by itself (/work/shared/notes/backends.md), and a botocore hook (the plugin's
``fault_injection``) works only inside the plugin process. This proxy sits on the wire instead, so the plugin runs
with its production configuration apart from ``endpoint_url``: every request is forwarded to the emulator untouched,
except a ``RunInstances`` for an instance type in ``refuse_types`` (after the first ``forward_first`` of that type:
capacity that runs out part-way), which gets EC2's own error document (``InsufficientInstanceCapacity``, HTTP 500,
as EC2 sends it) and never reaches the emulator.

It records the ``(InstanceType, forwarded)`` of every ``RunInstances`` it saw, never a parameter beyond the type (the
user-data in a RunInstances body carries a join token).
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
import uuid
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Bodies above this are refused (a RunInstances with 16 KiB of user-data is ~25 KiB once encoded).
MAX_BODY = 1 << 20
UPSTREAM_TIMEOUT = 30.0
Headers = list[tuple[str, str]]

CAPACITY_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>"
    "<Message>We currently do not have sufficient {type} capacity in the Availability Zone you requested."
    " Our system will be working on provisioning additional capacity.</Message></Error></Errors>"
    "<RequestID>{request_id}</RequestID></Response>"
)


class FaultProxy:
    """``with FaultProxy(moto_url, refuse_types={"c5.xlarge"}) as proxy:``, then point the plugin at ``proxy.url``."""

    def __init__(self, upstream: str, refuse_types: Iterable[str] = (), forward_first: int = 0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        assert parts.scheme == "http" and parts.hostname == "127.0.0.1", upstream  # loopback emulator only
        self.upstream = (parts.hostname, parts.port or 80)
        self.refuse_types = frozenset(refuse_types)
        self.forward_first = forward_first  # RunInstances of a refused type forwarded before the refusals start
        self.run_instances: list[tuple[str, bool]] = []  # (InstanceType, forwarded) per RunInstances seen
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def refused(self) -> list[str]:
        with self._lock:
            return [t for t, forwarded in self.run_instances if not forwarded]

    def forwarded(self) -> list[str]:
        with self._lock:
            return [t for t, forwarded in self.run_instances if forwarded]

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # --- one request ----------------------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Headers, bytes]:
        """What to send back for one request: EC2's capacity error, or the emulator's own answer."""
        if method == "POST":
            form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
            if form.get("Action") == ["RunInstances"]:
                kind = (form.get("InstanceType") or ["?"])[0]
                with self._lock:
                    done = sum(1 for t, forwarded in self.run_instances if t == kind and forwarded)
                    refuse = kind in self.refuse_types and done >= self.forward_first
                    self.run_instances.append((kind, not refuse))
                if refuse:
                    doc = CAPACITY_ERROR.format(type=kind, request_id=uuid.uuid4())
                    return 500, [("Content-Type", "text/xml;charset=UTF-8")], doc.encode()
        conn = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in ("connection", "keep-alive")}
            conn.request(method, path, body=body or None, headers=sent)
            reply = conn.getresponse()
            data = reply.read()
            kept = [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP_BY_HOP]
            return reply.status, kept, data
        finally:
            conn.close()


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # botocore keeps connections open

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.send_error(413)
                return
            body = self.rfile.read(length) if length else b""
            status, headers, data = proxy.answer(self.command, self.path, dict(self.headers.items()), body)
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # request lines could carry query parameters: nothing is logged

    return Handler
