"""Plugin processes that never outlive their caller, and bounded readers for their output.

``trio.run_process`` on cancel signals the direct child only; a grandchild (``sleep 100 &`` in a shell script)
survives and, holding the pipes, can keep a reader waiting forever (notes/trio-patterns.md). So every plugin starts
in a new session, which makes it the leader of its own process group, and whatever way the caller leaves the
``open_group_process`` block (result, error, timeout, cancel), a shielded ``finally`` signals the whole group:
SIGTERM, a short grace, SIGKILL.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import trio

_POLL = 0.01  # seconds between checks that a TERMed group is gone (only while it lingers)


class OutputTooLarge(Exception):
    """A stream carried more bytes than allowed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"more than {limit} bytes")


@asynccontextmanager
async def open_group_process(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None, grace: float = 1.0
) -> AsyncIterator[trio.Process]:
    """Start ``argv`` with piped stdin/stdout/stderr as the leader of a new process group; kill the group on exit.

    Raises ``OSError`` when the program cannot be started (missing, not executable).
    """
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            await kill_group(process, grace)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    await stream.aclose()


async def kill_group(process: trio.Process, grace: float) -> None:
    """SIGTERM the process group led by ``process``, wait up to ``grace`` seconds for the leader and then for the
    rest of the group, SIGKILL whatever is left, and reap the leader.

    Runs even after the leader has exited: its grandchildren may still be around. The group id is the leader's pid;
    once the leader is reaped that number could in theory be reused, but only after a full pid wrap-around, and we
    signal a group id only right after seeing it alive.
    """
    pgid = process.pid
    if not _signal_group(pgid, signal.SIGTERM):
        await process.wait()  # the group is gone already: just reap the leader
        return
    with trio.move_on_after(grace):
        await process.wait()
        # The leader is gone; give its descendants the rest of the grace to exit on their own. A poll on purpose:
        # nothing tells us when the last of a process group (not our children) has exited.
        while _signal_group(pgid, 0):  # noqa: ASYNC110
            await trio.sleep(_POLL)
    _signal_group(pgid, signal.SIGKILL)
    await process.wait()


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the group; False when no process of the group is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError as exc:  # a descendant changed uid: we cannot kill it, and must not pretend we did
        if exc.errno == errno.EPERM:
            return True
        raise
    return True


async def read_capped(stream: trio.abc.ReceiveStream, limit: int) -> bytes:
    """Everything until EOF, or ``OutputTooLarge`` as soon as more than ``limit`` bytes arrived."""
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
        if len(data) > limit:
            raise OutputTooLarge(limit)
    return bytes(data)


class StderrTail:
    """The last ``limit`` bytes of a stream (plugins log freely to stderr; only the end explains a failure)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._data = bytearray()
        self.truncated = False
        self.eof = trio.Event()

    def feed(self, chunk: bytes | bytearray) -> None:
        self._data += chunk
        if len(self._data) > 2 * self._limit:  # trim in batches, not per chunk
            del self._data[: len(self._data) - self._limit]
            self.truncated = True

    async def drain(self, stream: trio.abc.ReceiveStream) -> None:
        """Feed from ``stream`` until EOF (or until the stream is closed under us)."""
        try:
            while chunk := await stream.receive_some(65536):
                self.feed(chunk)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        self.eof.set()

    def text(self) -> str:
        """The tail as text. A cut-off first line is dropped, so a secret split by the cut cannot survive
        redaction as a fragment; the caller must still redact the result."""
        data = bytes(self._data)
        truncated = self.truncated
        if len(data) > self._limit:
            data = data[-self._limit :]
            truncated = True
        if truncated:
            _, _, data = data.partition(b"\n")
        return data.decode("utf-8", "replace").strip()
