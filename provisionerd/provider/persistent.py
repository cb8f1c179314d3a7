"""The persistent transport: one long-lived plugin process speaking JSON lines, many calls in flight.

The daemon writes ``{"id", "action", "input"}`` lines; the plugin answers ``{"id", "result"}`` or
``{"id", "error"}`` lines in any order. One writer task coalesces queued lines into one write (a write per line
costs ~5x throughput, notes/trio-patterns.md); one reader task splits stdout into bounded lines and hands each
answer to the waiting call by id. Outputs are validated in the caller's task, not the reader's. Deadlines are
kept by one watchdog task per plugin process (``_watch``) rather than a cancel scope per call, which costs more
than the rest of a call's transport overhead together.

Decisions (the contract lets the daemon choose; docs/providers.md tells authors):
- A line that is not a well-formed answer, or answers an id nobody asked, poisons the stream: we cannot tell
  which call it belonged to. All pending calls fail with ``ProviderProtocolViolation`` and the plugin is killed
  and restarted. Late answers to calls that were cancelled or timed out are *not* violations: they are dropped.
- A call that times out raises ``ProviderTimeout`` and the plugin is killed and restarted (the whole process
  group, as in one-shot): a plugin that does not answer in time is presumed wedged, and a hung action must not
  keep running in the cloud. Other calls in flight then fail with ``ProviderCrashed`` (outcome unknown), also
  those whose deadline passes while the plugin is being killed.
  A call cancelled by its caller (not timed out) only abandons its id.
- When the plugin dies, every pending call fails with ``ProviderCrashed`` and the plugin is restarted after an
  exponential backoff on trio's clock (``Backoff``); calls made meanwhile wait for it within their own timeout,
  and fail with ``ProviderCrashed`` (nothing sent, outcome known) if it is not back in time.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from provisionerd.domain.errors import ProviderCrashed, ProviderError, ProviderProtocolViolation, ProviderTimeout
from provisionerd.provider.contract import decode_page_answer
from provisionerd.provider.lines import Answer, BadFrame, LineSplitter, LineTooLong, parse_answer
from provisionerd.provider.process import StderrTail, kill_group, open_group_process
from provisionerd.provider.runtime import (
    ProviderConfig,
    Redactor,
    check_input,
    check_output,
    dump_json,
    join_tokens,
    read_error_body,
    redactor_for,
    snippet,
)
from provisionerd.provider.values import ListingPage

log = logging.getLogger(__name__)
_BATCH = 512  # lines per write at most
_ABANDONED = 4096  # ids of cancelled/timed-out calls remembered, so their late answers are dropped quietly
_RECENT_TOKENS = 4096  # join tokens remembered for redacting the shared stderr tail
_QUOTED_STDERR = 1000  # characters of the stderr tail quoted in an error detail
_EXITED = "the plugin exited or closed its stdout before answering"


@attrs.frozen
class Backoff:
    """Restart delays: ``initial`` after a first death, times ``factor`` per consecutive death up to ``maximum``;
    a process that lived ``reset_after`` seconds starts the sequence over."""

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 30.0
    reset_after: float = 30.0

    def next_delay(self, previous: float | None, lived: float) -> float:
        if previous is None or lived >= self.reset_after:
            return self.initial
        return min(self.maximum, previous * self.factor)


@attrs.define(eq=False)
class _Pending:
    action: str
    timeout: float
    deadline: float  # on trio's clock
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: Answer | None = None
    failure: ProviderError | None = None
    #: ``list_page``'s: a regular page is decoded straight into ``page``, with its line
    #: (``contract.decode_page_answer``).
    typed: bool = False
    page: ListingPage | None = None


@attrs.define(eq=False)
class _Generation:
    """One run of the plugin process; ``reason`` is the first reason it stopped (None while serving).

    ``alarm`` is the watchdog's sleep: its deadline is the earliest deadline of the pending calls (or later)."""

    send: trio.MemorySendChannel[bytes]
    scope: trio.CancelScope
    reason: tuple[type[ProviderError], str] | None = None
    alarm: trio.CancelScope = attrs.field(factory=trio.CancelScope)


def request_line(ident: int, action: str, body: str) -> bytes:
    """``{"id", "action", "input"}`` as one compact JSON line, ``body`` being ``dump_json(input)``: the bytes
    ``dump_json`` gives for that dict (an action, checked against ``ACTIONS`` before this, is an identifier that
    needs no escape: tests/provider/test_fast_paths.py compares the two)."""
    return f'{{"id":{ident},"action":"{action}","input":{body}}}\n'.encode()


class PersistentProvider:
    """A ``PluginTransport`` over one supervised plugin process. Start ``run`` in a nursery (or use
    ``open_persistent_provider``); ``call`` is safe from many tasks at once."""

    def __init__(self, config: ProviderConfig, *, backoff: Backoff = Backoff()) -> None:
        self.config = config
        self.name = config.name
        self.backoff = backoff
        self.restarts = 0  # generations started after the first (observable by tests and metrics)
        self._argv = [config.path, *config.args]
        self._env = config.plugin_env()
        self._redact = redactor_for(config)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._abandoned: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._tokens: collections.deque[str] = collections.deque(maxlen=_RECENT_TOKENS)
        self._room = trio.lowlevel.ParkingLot()  # callers waiting for fewer than max_in_flight pending calls
        self._gen: _Generation | None = None
        self._up = trio.Event()
        self._last_failure = "the plugin has not started yet"
        self._closed = False
        self._typed = 0  # ``list_page`` calls in flight: only then is an answer line first read as raw JSON

    # --- calls ---------------------------------------------------------------------------------------------------

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        answer = await self._call(action, input, timeout, typed=False)
        assert isinstance(answer, dict)
        return answer

    async def list_page(
        self,
        input: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> ListingPage | dict[str, Any]:
        """``call("listMachines", input)``, with a regular page decoded straight into its rows as the line arrives
        (``contract.decode_page_answer``: the line and its page in one pass, checked by their types, no dicts made),
        else the checked document as ``call`` gives it. ~0.07 s of CPU less for an orphan pass over 100,000
        machines (issue 36), and ~0.02 s more for reading the line in the same pass."""
        return await self._call("listMachines", input, timeout, typed=True)

    async def _call(
        self,
        action: str,
        input: Mapping[str, Any],
        timeout: float | None,  # noqa: ASYNC109
        *,
        typed: bool,
    ) -> ListingPage | dict[str, Any]:
        tokens = join_tokens(action, input)
        redact = self._redact.including(tokens)
        try:
            body: str | None = dump_json(input)
        except (TypeError, ValueError):
            body = None  # not JSON: the check names what breaks the schema, else the encoder's error is raised
        check_input(self.name, action, input, redact, encoded=body)
        body = dump_json(input) if body is None else body
        timeout = self.config.timeout_for(action) if timeout is None else timeout
        if not timeout >= 0:  # as trio.move_on_after would say (NaN fails this test too)
            raise ValueError(f"timeout must be non-negative, not {timeout!r}")
        deadline = trio.current_time() + timeout
        ident = next(self._ids)
        line = request_line(ident, action, body)
        gen = self._gen
        if gen is None or len(self._pending) >= self.config.limits.max_in_flight:
            gen = await self._admission(deadline)
            if gen is None:
                error = ProviderCrashed(
                    self.name, action, f"the plugin was not running for {timeout:g} s: {self._last_failure}"
                )
                error.outcome_unknown = False  # nothing was sent
                raise error
        # Why no cancel scope around the wait: a ``move_on_after`` per call cost ~16 us of trio bookkeeping, the
        # largest share of the transport's own overhead (bench/providers.py). The generation's watchdog (``_watch``)
        # enforces the deadline instead; a call only has to move its alarm when its deadline is the earliest.
        pending = self._pending[ident] = _Pending(action, timeout, deadline, typed=typed)
        if deadline < gen.alarm.deadline:
            gen.alarm.deadline = deadline
        self._tokens.extend(tokens)
        gen.send.send_nowait(line)  # unbounded channel, bounded by max_in_flight
        self._typed += typed
        try:
            await pending.done.wait()
        finally:
            self._typed -= typed
            if not pending.done.is_set():  # cancelled by our caller: the answer may still come
                self._abandon(ident)
            if self._room:
                self._room.unpark()
        if pending.page is not None:
            return pending.page
        return self._outcome(action, pending, redact)

    async def _admission(self, deadline: float) -> _Generation | None:
        """The slow path of ``call``: wait (until ``deadline``) for room among the calls in flight and for a
        serving generation; None if that did not happen in time."""
        with trio.move_on_at(deadline):
            while True:
                while len(self._pending) >= self.config.limits.max_in_flight:
                    await self._room.park()
                gen = await self._serving()
                if len(self._pending) < self.config.limits.max_in_flight:  # no one took the room meanwhile
                    return gen
        return None

    def _outcome(self, action: str, pending: _Pending, redact: Redactor) -> dict[str, Any]:
        if pending.failure is not None:
            raise pending.failure
        answer = pending.answer
        assert answer is not None
        if answer.is_error:
            typed = read_error_body(self.name, action, answer.error, redact)
            if typed is None:
                raise ProviderProtocolViolation(
                    self.name, action, f"the error is not an error body: {snippet(json.dumps(answer.error), redact)}"
                )
            raise typed
        return check_output(self.name, action, answer.result, redact, parsed=True)

    async def _serving(self) -> _Generation:
        """The generation serving now, waiting for a (re)start if there is none."""
        while self._gen is None:
            if self._closed:
                raise ProviderCrashed(self.name, "call", "the provider client is closed")
            await self._up.wait()
        return self._gen

    def _abandon(self, ident: int) -> None:
        self._pending.pop(ident, None)
        self._abandoned[ident] = None
        while len(self._abandoned) > _ABANDONED:
            self._abandoned.popitem(last=False)

    async def aclose(self) -> None:
        """Stop serving: pending and later calls fail with ``ProviderCrashed``; the supervisor's scope is
        cancelled by whoever runs it (``open_persistent_provider`` does)."""
        self._closed = True
        if self._gen is not None:
            self._end(self._gen, ProviderCrashed, "the provider client was closed")
        self._up.set()  # wake waiting callers so they see the closed flag

    def _end(self, gen: _Generation, kind: type[ProviderError], detail: str) -> None:
        """Stop ``gen`` (first reason wins): no new call may join it; its pending calls fail once it is dead."""
        if gen.reason is None:
            gen.reason = (kind, detail)
        gen.scope.cancel()
        if self._gen is gen:
            self._gen = None
            self._up = trio.Event()

    # --- supervision ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the plugin, serve it, and restart it after each death until cancelled or closed."""
        task_status.started()
        delay: float | None = None
        while not self._closed:
            started = trio.current_time()
            await self._serve_once()
            if self._closed:
                return
            delay = self.backoff.next_delay(delay, trio.current_time() - started)
            log.warning("provider %s: %s; restarting in %.2f s", self.name, self._last_failure, delay)
            await trio.sleep(delay)
            self.restarts += 1

    async def _serve_once(self) -> None:
        limits = self.config.limits
        tail = StderrTail(limits.stderr_tail, self._tail_redactor)  # redacted before any cut
        send, receive = trio.open_memory_channel[bytes](float("inf"))
        gen = _Generation(send, trio.CancelScope())
        workdir = tempfile.mkdtemp(prefix="provisionerd-plugin-")
        proc: trio.Process | None = None
        try:
            async with open_group_process(self._argv, env=self._env, cwd=workdir, grace=limits.term_grace) as proc:
                assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all pipes
                with gen.scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._write, gen, proc.stdin, receive)
                        nursery.start_soon(self._read, gen, proc.stdout)
                        nursery.start_soon(tail.drain, proc.stderr)
                        nursery.start_soon(self._reap, proc, limits.term_grace)
                        nursery.start_soon(self._watch, gen)
                        self._gen = gen
                        self._up.set()
        except OSError as exc:
            self._end(gen, ProviderCrashed, f"cannot start {self._argv[0]!r}: {exc.strerror}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            self._end(gen, ProviderCrashed, _EXITED)
            send.close()
        assert gen.reason is not None
        kind, detail = gen.reason
        if detail == _EXITED and proc is not None:
            detail += f" (exit status {proc.returncode})"
        stderr = tail.text(_QUOTED_STDERR)  # redacted (credentials and recent join tokens), then cut
        if stderr:
            detail += f"; stderr tail: {snippet(stderr, self._redact, _QUOTED_STDERR)}"
        self._last_failure = detail
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.failure = kind(self.name, item.action, detail)
            item.done.set()

    def _tail_redactor(self) -> Redactor:
        """The credentials and the join tokens of recent calls: what a plugin's stderr may echo."""
        return self._redact.including(self._tokens)

    async def _write(
        self, gen: _Generation, stdin: trio.abc.SendStream, receive: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        try:
            async for first in receive:
                batch = [first]
                while len(batch) < _BATCH:
                    try:
                        batch.append(receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                await stdin.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._end(gen, ProviderCrashed, "the plugin stopped reading its stdin")

    async def _read(self, gen: _Generation, stdout: trio.abc.ReceiveStream) -> None:
        splitter = LineSplitter(self.config.limits.max_line)
        try:
            while chunk := await stdout.receive_some(65536):
                for line in splitter.feed(bytes(chunk)):  # (a no-op for bytes, what a pipe gives)
                    if line and not line.isspace() and not self._dispatch(gen, line):
                        return
        except LineTooLong as exc:
            self._end(
                gen, ProviderProtocolViolation, f"an output line exceeds {exc.limit} bytes; the plugin was killed"
            )
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._end(gen, ProviderCrashed, _EXITED)

    def _dispatch(self, gen: _Generation, line: bytes) -> bool:
        if self._typed and self._dispatch_page(line):
            return True
        try:
            answer = parse_answer(line)
        except BadFrame as exc:
            redact = self._redact.including(self._tokens)
            self._end(gen, ProviderProtocolViolation, f"{exc}: {snippet(line, redact)}; the plugin was killed")
            return False
        pending = self._pending.pop(answer.id, None)
        if pending is None:
            if answer.id in self._abandoned:
                del self._abandoned[answer.id]
                return True
            self._end(gen, ProviderProtocolViolation, f"an answer for unknown id {answer.id}; the plugin was killed")
            return False
        pending.answer = answer
        pending.done.set()
        return True

    def _dispatch_page(self, line: bytes) -> bool:
        """Hand a ``list_page`` call its page decoded into rows, if ``line`` answers one with a regular page;
        ``False`` for any other line (``_dispatch`` reads it as every other answer, so its faults are told as
        before)."""
        answer = decode_page_answer(line)
        if answer is None:
            return False
        pending = self._pending.get(answer.id)
        if pending is None or not pending.typed:
            return False
        del self._pending[answer.id]
        pending.page = answer.result
        pending.done.set()
        return True

    async def _watch(self, gen: _Generation) -> None:
        """Time out the calls whose deadline passed: each fails with ``ProviderTimeout`` and the plugin is killed
        (the others in flight then fail with ``ProviderCrashed``).

        It sleeps until the earliest pending deadline, known at its last look; a call with an earlier deadline
        moves the alarm forward. Calls usually finish long before their deadline, so this wakes about once per
        timeout period and scans at most ``max_in_flight`` calls when it does.
        """
        while True:
            now = trio.current_time()
            overdue = [(ident, p) for ident, p in self._pending.items() if p.deadline <= now]
            if overdue:
                for ident, pending in overdue:
                    self._abandon(ident)
                    pending.failure = ProviderTimeout(
                        self.name, pending.action, f"no answer within {pending.timeout:g} s; the plugin was restarted"
                    )
                    pending.done.set()
                actions = sorted({p.action for _, p in overdue})
                self._end(gen, ProviderCrashed, f"the plugin was restarted after a {', '.join(actions)} call timed out")
                return
            earliest = min((p.deadline for p in self._pending.values()), default=math.inf)
            gen.alarm = trio.CancelScope(deadline=earliest)
            with gen.alarm:
                await trio.sleep_forever()

    async def _reap(self, proc: trio.Process, grace: float) -> None:
        """When the leader exits, kill what is left of its group, so stdout reaches EOF and the reader ends
        the generation after reading every answer already written."""
        await proc.wait()
        await kill_group(proc, grace)


@asynccontextmanager
async def open_persistent_provider(
    config: ProviderConfig, *, backoff: Backoff = Backoff()
) -> AsyncIterator[PersistentProvider]:
    """A running ``PersistentProvider``; on exit the plugin's process group is killed."""
    client = PersistentProvider(config, backoff=backoff)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        try:
            yield client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()
