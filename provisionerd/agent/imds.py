"""Spot interruption and rebalance notices from the EC2 instance metadata service (IMDSv2), for the worker agent.

EC2 tells a spot instance it will be taken back two minutes ahead (``/latest/meta-data/spot/instance-action``:
``{"action": "terminate", "time": "2026-12-05T20:00:00Z"}``, 404 until then) and may recommend moving off it
earlier (``/latest/meta-data/events/recommendations/rebalance``: ``{"noticeTime": "..."}``, 404 until then). IMDSv2
wants a session token first (``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``), sent as
``X-aws-ec2-metadata-token`` with every read; a 401 means the token expired, and a new one is fetched.

:class:`NoticeWatch` polls both paths every ``interval`` seconds on trio's clock and hands every change to
``report`` (the agent's :meth:`~provisionerd.agent.worker.WorkerAgent.report_notice`, which sends it to the
controller in a ``WorkerStatus``: protocol §6.4 "Reclaim notices"). A notice once seen is kept (the later time
wins): the instance is doomed either way. A failed read is logged (once per kind of failure in a row, so a machine
without a metadata service does not fill its log) and tried again at the next interval: the agent never stops for
the metadata service. Times are the notices' own wall-clock times as epoch seconds; nothing here mixes them with
trio's clock.

The HTTP client is the smallest that IMDS needs (HTTP/1.1, ``Connection: close``, a bounded answer) so the agent
keeps its one runtime dependency, trio; tests inject a fake ``Fetch``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from urllib.parse import urlsplit

import attrs
import trio

from provisionerd.telemetry.logging_setup import event_extra

log = logging.getLogger(__name__)

TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
#: What a session token is asked for (seconds); it is fetched again on a 401 or once it is this old.
TOKEN_TTL = 21600
#: AWS's advice for the interruption notice: poll every 5 seconds.
DEFAULT_INTERVAL = 5.0
#: One answer's limit (IMDS answers are a few hundred bytes) and one request's time limit.
MAX_ANSWER = 64 * 1024
REQUEST_TIMEOUT = 2.0

#: ``(method, path, headers) -> (status, body)``; raises ``OSError``/``trio.TooSlowError``/``ImdsError``.
Fetch = Callable[[str, str, Mapping[str, str]], Awaitable[tuple[int, bytes]]]


class ImdsError(Exception):
    """The metadata service answered something that is not HTTP, or too much."""


@attrs.frozen
class Notices:
    """The notices seen so far (epoch seconds; 0 = none)."""

    reclaim_at: float = 0.0
    rebalance_at: float = 0.0
    action: str = ""

    def merged(self, other: Notices) -> Notices:
        """Both notices kept, the later time of two."""
        return Notices(
            max(self.reclaim_at, other.reclaim_at),
            max(self.rebalance_at, other.rebalance_at),
            other.action or self.action,
        )


def parse_time(text: object) -> float:
    """An IMDS time (RFC 3339, ``2026-12-05T20:00:00Z``) as epoch seconds. Raises ``ValueError``."""
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError(f"a notice time is an RFC 3339 string, not {text!r}")
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"a notice time needs a time zone, not {text!r}")
    value = moment.timestamp()
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"a notice time must be after 1970, not {text!r}")
    return value


def _document(body: bytes, what: str) -> dict[str, object]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is not a JSON object")
    return doc


def parse_instance_action(body: bytes) -> Notices:
    """``spot/instance-action``'s answer. Raises ``ValueError`` for an answer that is not one."""
    doc = _document(body, "spot/instance-action")
    action = doc.get("action")
    if not isinstance(action, str) or not 0 < len(action) <= 32:
        raise ValueError(f"spot/instance-action has no action: {action!r}")
    return Notices(reclaim_at=parse_time(doc.get("time")), action=action)


def parse_rebalance(body: bytes) -> Notices:
    """``events/recommendations/rebalance``'s answer. Raises ``ValueError`` for an answer that is not one."""
    doc = _document(body, "the rebalance recommendation")
    return Notices(rebalance_at=parse_time(doc.get("noticeTime")))


def http_fetch(base_url: str, timeout: float = REQUEST_TIMEOUT) -> Fetch:
    """A ``Fetch`` for ``http://HOST[:PORT]`` (IMDS is plain HTTP on a link-local address, never TLS)."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"the metadata service is http://HOST[:PORT], not {base_url!r}")
    host, port = parts.hostname, parts.port or 80
    authority = parts.netloc

    async def fetch(method: str, path: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {authority}", "Connection: close", "Content-Length: 0"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all(request)
                data = bytearray()
                while chunk := await stream.receive_some(16384):
                    data += chunk
                    if len(data) > MAX_ANSWER:
                        raise ImdsError(f"the metadata service answered more than {MAX_ANSWER} bytes")
        return _parse_response(bytes(data))

    return fetch


def _parse_response(data: bytes) -> tuple[int, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
        raise ImdsError(f"the metadata service's answer is not HTTP: {data[:40]!r}")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            body = body[: int(value.strip())]
        if name.strip().lower() == b"transfer-encoding":
            raise ImdsError("the metadata service answered with a transfer encoding this client does not read")
    return int(status_line[1]), body


class NoticeWatch:
    """Polls the metadata service for notices and reports each change (see the module docstring)."""

    def __init__(self, fetch: Fetch, report: Callable[[Notices], None], interval: float = DEFAULT_INTERVAL):
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
        self._fetch = fetch
        self._report = report
        self._interval = interval
        self._token = ""
        self._token_at = -math.inf
        self.notices = Notices()
        #: Reads that failed so far, and the last failure's text ("" after a read that worked).
        self.failures = 0
        self._failing = ""

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll()
            await trio.sleep(self._interval)

    async def poll(self) -> None:
        """One read of both paths; reports a change (a failure is logged and counted)."""
        try:
            found = Notices()
            for path, parse in ((INSTANCE_ACTION_PATH, parse_instance_action), (REBALANCE_PATH, parse_rebalance)):
                body = await self._get(path)
                if body is not None:
                    found = found.merged(parse(body))
        except (OSError, trio.TooSlowError, ImdsError, ValueError) as exc:
            self._failed(exc)
            return
        if self._failing:
            log.info("the metadata service answers again")
            self._failing = ""
        merged = self.notices.merged(found)
        if merged != self.notices:
            self.notices = merged
            log.warning(
                "reclaim notice from the metadata service: %s",
                _describe(merged),
                extra=event_extra(
                    "reclaim_notice", {"reclaim_at": merged.reclaim_at, "rebalance_at": merged.rebalance_at}
                ),
            )
            self._report(merged)

    async def _get(self, path: str) -> bytes | None:
        """``path``'s body; ``None`` on 404 (no notice). One new token on a 401."""
        for attempt in range(2):
            token = await self._session_token(fresh=attempt > 0)
            status, body = await self._fetch("GET", path, {"X-aws-ec2-metadata-token": token})
            if status == 200:
                return body
            if status == 404:
                return None
            if status != 401:
                raise ImdsError(f"GET {path} answered HTTP {status}")
        raise ImdsError(f"GET {path} refused a fresh session token (HTTP 401)")

    async def _session_token(self, *, fresh: bool) -> str:
        now = trio.current_time()
        if self._token and not fresh and now - self._token_at < TOKEN_TTL / 2:
            return self._token
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
        status, body = await self._fetch("PUT", TOKEN_PATH, headers)
        if status != 200 or not body or len(body) > 512:
            raise ImdsError(f"PUT {TOKEN_PATH} answered HTTP {status} ({len(body)} bytes)")
        self._token, self._token_at = body.decode("ascii", "replace").strip(), now
        return self._token

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        text = f"{type(exc).__name__}: {exc}"[:300]
        if text != self._failing:
            log.warning("cannot read notices from the metadata service (retrying every %g s): %s", self._interval, text)
        self._failing = text


def _describe(notices: Notices) -> str:
    parts = []
    if notices.reclaim_at:
        when = datetime.fromtimestamp(notices.reclaim_at).astimezone().isoformat(timespec="seconds")
        parts.append(f"spot {notices.action or 'interruption'} at {when}")
    if notices.rebalance_at:
        when = datetime.fromtimestamp(notices.rebalance_at).astimezone().isoformat(timespec="seconds")
        parts.append(f"rebalance recommended at {when}")
    return ", ".join(parts)
