"""Plugin processes that never outlive their caller, and bounded readers for their output.

``trio.run_process`` on cancel signals the direct child only; a grandchild (``sleep 100 &`` in a shell script)
survives and, holding the pipes, can keep a reader waiting forever (notes/trio-patterns.md). So every plugin starts
in a new session, which makes it the leader of its own process group, and whatever way the caller leaves the
``open_group_process`` block (result, error, timeout, cancel), a shielded ``finally`` signals the whole group:
SIGTERM, a short grace, SIGKILL.
"""

from __future__ import annotations

import codecs
import errno
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

import trio

_POLL = 0.01  # seconds between checks that a TERMed group is gone (only while it lingers)


class OutputTooLarge(Exception):
    """A stream carried more bytes than allowed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"more than {limit} bytes")


@asynccontextmanager
async def open_group_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    grace: float = 1.0,
    detached: bool = False,
) -> AsyncIterator[trio.Process]:
    """Start ``argv`` with piped stdin/stdout/stderr as the leader of a new process group; kill the group on exit.
    ``detached``: stdin, stdout and stderr on ``/dev/null`` instead (the one-shot transport's wrapper, which
    writes the plugin's output to files: a daemon killed mid-call must not take the call down with its pipes).

    Raises ``OSError`` when the program cannot be started (missing, not executable).
    """
    stdio = subprocess.DEVNULL if detached else subprocess.PIPE
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=stdio,
        stdout=stdio,
        stderr=stdio,
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
    """The last ``limit`` characters of a stream, redacted (plugins log freely to stderr; only the end explains a
    failure, and they echo their credentials and inputs in tracebacks).

    Redact, then truncate: a cut made first could split a secret and leave a fragment no redaction recognises
    (issue 16: 40 of 43 characters of a token survived a cut at 1,000). So the buffer is redacted before each
    trim and before each quote, and every cut is made in redacted text. A secret still arriving when a trim runs
    (its first characters at the end of the buffer) cannot be cut: a trim keeps at least the longest secret's
    length. ``redactor`` is asked at each trim, so a long-lived tail (the persistent transport's) redacts the
    join tokens of calls made after it started.

    Bytes are decoded incrementally (UTF-8, invalid bytes replaced), so a character split between two chunks is
    decoded whole. Memory: at most ``2 * max(limit, longest secret)`` characters plus one chunk.
    """

    def __init__(self, limit: int, redactor: Callable[[], TextRedactor] | None = None) -> None:
        self._limit = limit
        self._redactor = redactor
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""
        self.truncated = False
        self.eof = trio.Event()

    def feed(self, chunk: bytes | bytearray) -> None:
        self._text += self._decoder.decode(bytes(chunk))
        if len(self._text) > 2 * self._limit:  # trim in batches, not per chunk
            redact = self._redact()
            keep = max(self._limit, redact.reach)
            text = redact(self._text)
            if len(text) > keep:
                text = text[-keep:]
                self.truncated = True
            self._text = text

    async def drain(self, stream: trio.abc.ReceiveStream) -> None:
        """Feed from ``stream`` until EOF (or until the stream is closed under us)."""
        try:
            while chunk := await stream.receive_some(65536):
                self.feed(chunk)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        self.eof.set()

    def text(self, limit: int | None = None) -> str:
        """The redacted tail, at most ``limit`` (default: the tail's limit) characters. A cut-off first line is
        dropped (a fragment of a line explains nothing); the cut is made after redaction either way."""
        limit = self._limit if limit is None else min(limit, self._limit)
        text = self._redact()(self._text)
        truncated = self.truncated
        if len(text) > limit:
            text = text[-limit:]
            truncated = True
        if truncated:
            _, _, text = text.partition("\n")
        return text.strip()

    def _redact(self) -> TextRedactor:
        return _NO_SECRETS if self._redactor is None else self._redactor()


class TextRedactor(Protocol):
    """What ``StderrTail`` needs of a redactor (``telemetry.redaction.Redactor``): the text with every secret
    replaced, and ``reach``, the length of the longest text it replaces."""

    @property
    def reach(self) -> int: ...

    def __call__(self, text: str, /) -> str: ...


class _Nothing:
    reach = 0

    def __call__(self, text: str, /) -> str:
        return text


_NO_SECRETS: TextRedactor = _Nothing()
