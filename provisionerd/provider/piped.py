"""A one-shot read call on pipes: the plugin's stdout and stderr read by the daemon as they come.

A read (``getRequestStatus``, ``getAvailableTemplates``, ``listMachines``, ``getReturnRequests``,
``describeProvider``) lost with a crashed daemon costs nothing (it is asked again), so it does not need what a
mutation gets (``provider.calls``: the wrapper, the call directory, the answer in a file): it skips the wrapper's
interpreter start, about ten times the cost of the call itself on a loaded machine (measured: 12-15 ms a call on
pipes, 110-170 ms under the wrapper, load 8 on 2 cores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import trio

from provisionerd.provider.process import OutputTooLarge, StderrTail, kill_group, open_group_process, read_capped


@attrs.define(eq=False)
class PipedResult:
    stdout: bytes
    returncode: int | None
    too_large: bool
    timed_out: bool


async def run_piped(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    deadline: float,
    max_output: int,
    grace: float,
    tail: StderrTail,
    partial: bytearray | None = None,
) -> PipedResult:
    """Run ``argv`` as a new process group within ``deadline`` seconds, stdout read up to ``max_output`` bytes
    (one more and the group is killed), stderr into ``tail``. The group is killed whatever way this returns.
    Raises ``OSError`` when the program cannot be started."""
    capture = _Capture(partial)
    with trio.move_on_after(deadline) as scope:
        async with open_group_process(argv, env=env, cwd=cwd, grace=grace) as proc:
            assert proc.stdout is not None and proc.stderr is not None  # all three are pipes
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tail.drain, proc.stderr)
                nursery.start_soon(capture.read, proc.stdout, max_output, nursery.cancel_scope)
                await proc.wait()
                # Leftover descendants die now: they may hold stdout open, and they must not outlive the call
                # anyway. Then stdout reaches EOF and the reader finishes.
                await kill_group(proc, grace)
                await capture.done.wait()
                with trio.move_on_after(grace):
                    await tail.eof.wait()  # the error detail wants the whole tail
                nursery.cancel_scope.cancel()  # stderr, if a process that left the group holds it
    return PipedResult(capture.stdout, proc.returncode, capture.too_large, scope.cancelled_caught)


class _Capture:
    """A call's stdout, read to EOF in its own task (a pipe must be drained while the plugin writes)."""

    def __init__(self, partial: bytearray | None = None) -> None:
        self.stdout = b""
        self.too_large = False
        self.done = trio.Event()
        self._partial = partial

    async def read(self, stream: trio.abc.ReceiveStream, limit: int, scope: trio.CancelScope) -> None:
        if self._partial is not None:
            await self._read_keeping(stream, limit, scope, self._partial)
            return
        try:
            self.stdout = await read_capped(stream, limit)
            self.done.set()
        except OutputTooLarge:
            self.too_large = True
            scope.cancel()  # the group is killed on leaving the process block

    async def _read_keeping(
        self, stream: trio.abc.ReceiveStream, limit: int, scope: trio.CancelScope, into: bytearray
    ) -> None:
        # The same as read_capped, but every chunk lands in the caller's buffer at once: a cancellation (the
        # call's deadline) leaves there what had arrived.
        while chunk := await stream.receive_some(65536):
            into += chunk
            if len(into) > limit:
                self.too_large = True
                scope.cancel()
                return
        self.stdout = bytes(into)
        self.done.set()
