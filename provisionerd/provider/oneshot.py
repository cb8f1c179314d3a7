"""The one-shot transport (LSF resource connector style): one process per call.

``<path>/<action>.sh -f <dir>/in.json`` runs with a private temporary directory as its cwd (mode 0700, the input
file 0600, removed afterwards) and the LSF-like environment of ``ProviderConfig.plugin_env``. Exit 0: stdout is the
output document. Non-zero exit: stdout is an error document ``{"error": {...}}`` (-> the ``ProviderRejected``
subclass of its code) or a plain message (-> ``ProviderFailed``, code ``provider_error``), as LSF plugins do; a
non-zero exit with nothing on stdout, or death by a signal, is a crash (``ProviderCrashed``: the outcome is
unknown).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import trio

from provisionerd.domain.errors import (
    ProviderCrashed,
    ProviderFailed,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnsupported,
)
from provisionerd.provider.process import (
    OutputTooLarge,
    StderrTail,
    kill_group,
    open_group_process,
    read_capped,
)
from provisionerd.provider.runtime import (
    ProviderConfig,
    Redactor,
    check_input,
    check_output,
    join_tokens,
    parse_json,
    read_error_body,
    redactor_for,
    snippet,
)

_QUOTED_STDERR = 1000  # characters of a plugin's stderr tail quoted in an error detail


def signal_name(number: int) -> str:
    """A readable name for the signal that killed a plugin. Real-time signals (``SIGRTMIN..SIGRTMAX``) are valid
    signals but not ``signal.Signals`` members, so they are named relative to ``SIGRTMIN``; anything else unknown
    is its number. Never raises: a plugin's exit status must always become a typed ``ProviderCrashed``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low <= number <= high:
        return f"SIGRTMIN+{number - low}"
    return f"signal {number}"


class OneShotProvider:
    """A ``PluginTransport`` that runs ``<config.path>/<action>.sh`` once per call. Calls may run concurrently."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        self._env = config.plugin_env()
        self._redact = redactor_for(config)

    def script(self, action: str) -> Path:
        return Path(self.config.path) / f"{action}.sh"

    def supports(self, action: str) -> bool:
        return os.access(self.script(action), os.X_OK)

    async def aclose(self) -> None:
        """Nothing to close: no process outlives its call."""

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        redact = self._redact.including(join_tokens(action, input))
        check_input(self.name, action, input, redact)
        return await self._execute(action, input, timeout, redact, validate=True)

    async def run_document(
        self,
        action: str,
        document: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        secrets: Collection[str] = (),
        partial: bytearray | None = None,
    ) -> Any:
        """Run ``<action>.sh`` on ``document`` as it is: no input or output schema check (the caller, the legacy
        adapter, sends LSF shapes and normalises what LSF plugins print before checking it). Everything else is as
        for ``call``: timeouts, process-group kill, caps, typed errors, and ``secrets`` redacted from them. Returns
        the parsed JSON of a successful answer.

        ``partial``, when given, receives stdout as it arrives (up to the cap): after a ``ProviderTimeout`` it holds
        whatever the plugin printed before it was killed (a requestId printed before a hang is not lost)."""
        redact = self._redact.including(secrets)
        return await self._execute(action, document, timeout, redact, validate=False, partial=partial)

    async def _execute(
        self,
        action: str,
        document: Mapping[str, Any],
        timeout: float | None,  # noqa: ASYNC109
        redact: Redactor,
        *,
        validate: bool,
        partial: bytearray | None = None,
    ) -> Any:
        script = self.script(action)
        if not script.is_file():
            raise ProviderUnsupported(self.name, action, f"no {script.name} in the plugin directory")
        deadline = self.config.timeout_for(action) if timeout is None else timeout
        workdir = tempfile.mkdtemp(prefix="provisionerd-call-")  # 0700, ours alone
        try:
            infile = os.path.join(workdir, "in.json")
            fd = os.open(infile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_dumps(document))
            argv = [str(script), "-f", infile]
            return await self._run(action, argv, workdir, deadline, redact, validate, partial)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run(
        self,
        action: str,
        argv: list[str],
        workdir: str,
        deadline: float,
        redact: Redactor,
        validate: bool = True,
        partial: bytearray | None = None,
    ) -> Any:
        limits = self.config.limits
        tail = StderrTail(limits.stderr_tail, lambda: redact)  # redacted before any cut
        capture = _Capture(partial)
        with trio.move_on_after(deadline) as scope:
            try:
                async with open_group_process(argv, env=self._env, cwd=workdir, grace=limits.term_grace) as proc:
                    assert proc.stdout is not None and proc.stderr is not None  # all three are pipes
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(tail.drain, proc.stderr)
                        nursery.start_soon(capture.read, proc.stdout, limits.max_output, nursery.cancel_scope)
                        await proc.wait()
                        # Leftover descendants die now: they may hold stdout open, and they must not outlive
                        # the call anyway. Then stdout reaches EOF and the reader finishes.
                        await kill_group(proc, limits.term_grace)
                        await capture.done.wait()
                        with trio.move_on_after(limits.term_grace):
                            await tail.eof.wait()  # the error detail wants the whole tail
                        nursery.cancel_scope.cancel()  # stderr, if a process that left the group holds it
            except PermissionError as exc:
                raise ProviderUnsupported(self.name, action, f"cannot execute {argv[0]!r}: {exc.strerror}") from None
            except OSError as exc:
                raise ProviderCrashed(self.name, action, f"cannot start {argv[0]!r}: {exc.strerror}") from None
        if capture.too_large:
            raise ProviderProtocolViolation(
                self.name, action, f"stdout exceeds {limits.max_output} bytes; the plugin was killed"
            )
        if scope.cancelled_caught:
            raise ProviderTimeout(
                self.name,
                action,
                f"no answer within {deadline:g} s; the process group was killed{self._stderr(tail, redact)}",
            )
        stdout = capture.stdout
        returncode = proc.returncode
        assert returncode is not None  # the group was reaped on leaving the process block
        if returncode == 0:
            return self._success(action, stdout, tail, redact, validate)
        raise self._failure(action, returncode, stdout, tail, redact)

    def _success(self, action: str, stdout: bytes, tail: StderrTail, redact: Redactor, validate: bool) -> Any:
        try:
            document = parse_json(stdout)
        except ValueError:
            raise ProviderProtocolViolation(
                self.name, action, f"stdout is not JSON: {snippet(stdout, redact)}{self._stderr(tail, redact)}"
            ) from None
        return check_output(self.name, action, document, redact) if validate else document

    def _failure(
        self, action: str, returncode: int, stdout: bytes, tail: StderrTail, redact: Redactor
    ) -> ProviderRejected | ProviderCrashed:
        if returncode < 0:
            return ProviderCrashed(
                self.name, action, f"killed by {signal_name(-returncode)}{self._stderr(tail, redact)}"
            )
        text = stdout.decode("utf-8", "replace").strip()
        if not text:
            return ProviderCrashed(
                self.name, action, f"exited with status {returncode} and no message{self._stderr(tail, redact)}"
            )
        try:
            document = parse_json(text)
        except ValueError:
            document = None
        if isinstance(document, dict) and "error" in document:
            typed = read_error_body(self.name, action, document["error"], redact)
            if typed is not None:
                return typed
        # A plain message (the LSF convention) or an untyped document: the plugin refused, for its own reason.
        return ProviderFailed(self.name, action, redact(text)[:2000])

    @staticmethod
    def _stderr(tail: StderrTail, redact: Redactor) -> str:
        text = tail.text(_QUOTED_STDERR)  # redacted, then cut (issue 16: never cut first)
        return f"; stderr tail: {snippet(text, redact, _QUOTED_STDERR)}" if text else ""


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


def _dumps(document: Mapping[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"))
