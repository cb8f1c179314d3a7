"""Waiting on something observable: a probe polled until it answers, with a limit that names what never came.

A wait never sleeps a fixed time to order events: it polls what the other process makes visible (its admin socket,
a fact in the controller's store, a line in its log, a socket that accepts) and returns the first truthy answer.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import trio

T = TypeVar("T")

#: The default polling: the first probe again after 50 ms, each later one 1.5 times as long after, up to 250 ms. A
#: wait answered at once costs no latency; a long one (an agent joining, a lease expiring) does not keep the probed
#: process busy answering (a status query every 50 ms of a 30 s wait was 600 of them, each costing both sides).
FIRST, GROWTH, MOST = 0.05, 1.5, 0.25


def _pauses(interval: float | None) -> Iterator[float]:
    """The sleeps between probes: ``interval`` every time when given, else growing from ``FIRST`` to ``MOST``."""
    pause = interval if interval is not None else FIRST
    while True:
        yield pause
        if interval is None:
            pause = min(MOST, pause * GROWTH)


class WaitTimeout(AssertionError):
    """What a test waited for did not happen within its limit (an AssertionError: the test fails, naming it)."""


def _timed_out(what: str, limit: float, last: object) -> WaitTimeout:
    seen = f"; last seen: {last!r}"[:600] if last is not None else ""
    return WaitTimeout(f"not within {limit:g} s: {what}{seen}")


async def until(what: str, probe: Callable[[], Awaitable[T]], limit: float = 30.0, interval: float | None = None) -> T:
    """Await ``probe()`` until it returns something truthy and return that; ``WaitTimeout`` naming ``what`` after
    ``limit`` seconds (trio's clock). Probes every ``interval`` seconds when given, else as ``_pauses`` says."""
    last: object = None
    with trio.move_on_after(limit):
        for pause in _pauses(interval):
            last = await probe()
            if last:
                return last  # type: ignore[return-value]
            await trio.sleep(pause)
    raise _timed_out(what, limit, last)


async def until_sync(what: str, probe: Callable[[], T], limit: float = 30.0, interval: float | None = None) -> T:
    """``until`` for a probe that is a plain function (reads a store, a file, ``/proc``)."""

    async def call() -> T:
        return probe()

    return await until(what, call, limit, interval)


def blocking(what: str, probe: Callable[[], T], limit: float = 30.0, interval: float | None = None) -> T:
    """``until`` outside trio (fixtures, synchronous tests): polls on the monotonic clock."""
    deadline = time.monotonic() + limit
    last: object = None
    for pause in _pauses(interval):
        last = probe()
        if last:
            return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
    raise _timed_out(what, limit, last)


def log_has(path: Path, needle: str) -> Callable[[], bool]:
    """A probe: ``needle`` appears in the file at ``path`` (False while it does not exist)."""

    def probe() -> bool:
        try:
            return needle in path.read_text(errors="replace")
        except OSError:
            return False

    return probe


def accepts(host: str, port: int) -> Callable[[], bool]:
    """A probe: something accepts TCP connections on ``host:port``."""

    def probe() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    return probe


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
