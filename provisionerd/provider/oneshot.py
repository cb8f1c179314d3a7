"""The one-shot transport (LSF resource connector style): one process per call.

``<path>/<action>.sh -f <dir>/in.json`` runs with a private temporary directory as its cwd (mode 0700, the input
file 0600, removed afterwards) and the LSF-like environment of ``ProviderConfig.plugin_env``. Exit 0: stdout is the
output document. Non-zero exit: stdout is an error document ``{"error": {...}}`` (-> the ``ProviderRejected``
subclass of its code) or a plain message (-> ``ProviderFailed``, code ``provider_error``), as LSF plugins do; a
non-zero exit with nothing on stdout, or death by a signal, is a crash (``ProviderCrashed``: the outcome is
unknown).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import trio

from provisionerd.domain.errors import (
    ProviderCrashed,
    ProviderError,
    ProviderFailed,
    ProviderProtocolViolation,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnsupported,
)
from provisionerd.provider.calls import WRAPPER, CallDir, CallDirs, Collected, Leftover
from provisionerd.provider.callwrap import DROPPED
from provisionerd.provider.piped import run_piped
from provisionerd.provider.process import StderrTail, kill_group, open_group_process
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

log = logging.getLogger(__name__)

_QUOTED_STDERR = 1000
MUTATIONS = frozenset(
    {"requestMachines", "requestReturnMachines", "stopMachines", "returnLicenses"}
)  # characters of a plugin's stderr tail quoted in an error detail


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
        self.calls = CallDirs(config.calls_dir, config.name)
        self._leftovers: list[Leftover] = self.calls.leftovers()  # left by an earlier process, not collected yet

    def script(self, action: str) -> Path:
        return Path(self.config.path) / f"{action}.sh"

    def supports(self, action: str) -> bool:
        return os.access(self.script(action), os.X_OK)

    async def aclose(self) -> None:
        """Nothing to close: no process outlives its call (the call directories' lock is released)."""
        self.calls.close()

    async def call(self, action: str, input: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        redact = self._redact.including(join_tokens(action, input))
        check_input(self.name, action, input, redact)
        # Calls an earlier process left: a call about the same op waits for them (a listing of an op whose
        # requestMachines still runs would miss its machines), the finished ones are collected and logged.
        for done in [*self.take_finished(), *await self.take_op(op_of(input))]:
            _log_collected(self.name, done)
        return await self._execute(action, input, timeout, redact, validate=True)

    # --- calls an earlier process left behind (provider.calls) ------------------------------------------------

    def take_finished(self) -> list[Collected]:
        """Collect every leftover call that is no longer running (its directory is removed)."""
        if not self._leftovers:
            return []
        done = [left for left in self._leftovers if left.ended()]
        self._leftovers = [left for left in self._leftovers if left not in done]
        return [self._collect(left, timed_out=False) for left in done]

    def pending_ops(self) -> set[str]:
        """The ops of leftover calls still running."""
        return {left.op for left in self._leftovers if left.op and not left.ended()}

    async def take_op(self, op: str) -> list[Collected]:
        """Wait for the leftover calls of ``op`` (each until it ends or its recorded deadline passes: then its
        group is killed and it is a ``ProviderTimeout``) and collect them."""
        if not op:
            return []
        mine = [left for left in self._leftovers if left.op == op]
        found = []
        for left in mine:
            ended = await left.wait()
            # Forgotten only once collected: a caller cancelled while it waits leaves the call pending, never lost.
            self._leftovers.remove(left)
            found.append(self._collect(left, timed_out=not ended))
        return found

    def _collect(self, left: Leftover, *, timed_out: bool) -> Collected:
        call = left.dir
        try:
            if call.identity() is None and call.status() is None:
                return Collected(left.action, left.op, left.key, started=False)
            partial = bytearray()
            redact = self._redact.including(left.secrets)
            try:
                document = self._conclude(
                    left.action,
                    call,
                    redact,
                    left.validate,
                    partial,
                    None,
                    timed_out,
                    self.config.timeout_for(left.action),
                )
            except ProviderError as exc:
                return Collected(left.action, left.op, left.key, error=exc, stdout=bytes(partial))
            return Collected(left.action, left.op, left.key, document=document, stdout=bytes(partial))
        finally:
            call.remove()

    async def run_document(
        self,
        action: str,
        document: Mapping[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        secrets: Collection[str] = (),
        partial: bytearray | None = None,
        key: str = "",
        op: str = "",
    ) -> Any:
        """Run ``<action>.sh`` on ``document`` as it is: no input or output schema check (the caller, the legacy
        adapter, sends LSF shapes and normalises what LSF plugins print before checking it). Everything else is as
        for ``call``: timeouts, process-group kill, caps, typed errors, and ``secrets`` redacted from them. Returns
        the parsed JSON of a successful answer.

        ``partial``, when given, receives stdout as it arrives (up to the cap): after a ``ProviderTimeout`` it holds
        whatever the plugin printed before it was killed (a requestId printed before a hang is not lost). ``key``
        is recorded with the call: whoever collects it after a restart (``take_finished``/``take_op``) knows which
        of its calls it was, ``op`` which op it is about (default: the document's ``op_id`` or op tag)."""
        redact = self._redact.including(secrets)
        return await self._execute(
            action, document, timeout, redact, validate=False, partial=partial, key=key, op=op, secrets=secrets
        )

    async def _execute(
        self,
        action: str,
        document: Mapping[str, Any],
        timeout: float | None,  # noqa: ASYNC109
        redact: Redactor,
        *,
        validate: bool,
        partial: bytearray | None = None,
        key: str = "",
        op: str = "",
        secrets: Collection[str] = (),
    ) -> Any:
        script = self.script(action)
        if not script.is_file():
            raise ProviderUnsupported(self.name, action, f"no {script.name} in the plugin directory")
        deadline = self.config.timeout_for(action) if timeout is None else timeout
        if action not in MUTATIONS:
            return await self._read(action, document, deadline, redact, validate, partial)
        durable = self.calls.owned  # fsync'd: a mutation's answer must survive a power cut too
        try:
            call = self.calls.create(
                action,
                document,
                op=op or op_of(document),
                key=key,
                validate=validate,
                timeout=deadline,
                secrets=[*secrets, *join_tokens(action, document)],
                durable=durable,
            )
        except OSError as exc:  # nothing ran: a known outcome
            raise ProviderFailed(self.name, action, f"cannot prepare the call's directory: {exc.strerror}") from None
        try:
            limits = self.config.limits
            argv = [
                sys.executable,
                "-I",
                "-S",
                str(WRAPPER),
                str(call.path),
                str(limits.max_output),
                str(_stderr_keep(limits.stderr_tail)),
                "1" if durable else "0",
                str(script),
                "-f",
                str(call.infile),
            ]
            return await self._run(action, argv, call, deadline, redact, validate, partial)
        finally:
            call.remove()

    async def _read(
        self,
        action: str,
        document: Mapping[str, Any],
        deadline: float,
        redact: Redactor,
        validate: bool,
        partial: bytearray | None,
    ) -> Any:
        """A read: on pipes, in a temporary directory (``provider.piped``: nothing of it needs to survive us)."""
        script, limits = self.script(action), self.config.limits
        try:
            call = self.calls.create(
                action, document, op="", key="", validate=validate, timeout=deadline, temporary=True
            )
        except OSError as exc:
            raise ProviderFailed(self.name, action, f"cannot prepare the call's directory: {exc.strerror}") from None
        tail = StderrTail(limits.stderr_tail, lambda: redact)  # redacted before any cut
        try:
            result = await run_piped(
                [str(script), "-f", str(call.infile)],
                env=self._env,
                cwd=str(call.path),
                deadline=deadline,
                max_output=limits.max_output,
                grace=limits.term_grace,
                tail=tail,
                partial=partial,
            )
        except PermissionError as exc:
            raise ProviderUnsupported(self.name, action, f"cannot execute {str(script)!r}: {exc.strerror}") from None
        except OSError as exc:
            raise ProviderCrashed(self.name, action, f"cannot start {str(script)!r}: {exc.strerror}") from None
        finally:
            call.remove()
        if result.too_large:
            raise ProviderProtocolViolation(
                self.name, action, f"stdout exceeds {limits.max_output} bytes; the plugin was killed"
            )
        if result.timed_out:
            raise ProviderTimeout(
                self.name,
                action,
                f"no answer within {deadline:g} s; the process group was killed{self._stderr(tail, redact)}",
            )
        assert result.returncode is not None  # the group was reaped on leaving the process block
        if result.returncode == 0:
            return self._success(action, result.stdout, tail, redact, validate)
        raise self._failure(action, result.returncode, result.stdout, tail, redact)

    async def _run(
        self,
        action: str,
        argv: list[str],
        call: CallDir,
        deadline: float,
        redact: Redactor,
        validate: bool = True,
        partial: bytearray | None = None,
    ) -> Any:
        limits = self.config.limits
        with trio.move_on_after(deadline) as scope:
            try:
                async with open_group_process(
                    argv, env=self._env, cwd=str(call.path), grace=limits.term_grace, detached=True
                ) as proc:
                    await proc.wait()
                    # Leftover descendants die now: they must not outlive the call.
                    await kill_group(proc, limits.term_grace)
            except OSError as exc:  # the wrapper (our own interpreter) could not start: the plugin never ran
                raise ProviderFailed(self.name, action, f"cannot start the call wrapper: {exc.strerror}") from None
        assert proc.returncode is not None  # the group was reaped on leaving the process block
        return self._conclude(
            action, call, redact, validate, partial, proc.returncode, scope.cancelled_caught, deadline
        )

    def _conclude(
        self,
        action: str,
        call: CallDir,
        redact: Redactor,
        validate: bool,
        partial: bytearray | None,
        returncode: int | None,
        timed_out: bool,
        deadline: float,
    ) -> Any:
        """The answer (or typed error) of a call that ended, read from its directory: the live path and the
        collection of a call a dead daemon left behind (``returncode`` None: the wrapper was not our child)."""
        limits = self.config.limits
        tail = StderrTail(limits.stderr_tail, lambda: redact)  # redacted before any cut
        err = _read_tail(call.path / "stderr", 2 * _stderr_keep(limits.stderr_tail) + len(DROPPED))
        if err.startswith(DROPPED):
            tail.truncated, err = True, err[len(DROPPED) :]
        tail.feed(err)
        stdout = _read_head(call.path / "stdout", limits.max_output + 1)
        if partial is not None:
            partial += stdout  # whatever arrived (a requestId printed before a hang is not lost)
        status = call.status()
        if status is not None and "exec_error" in status:
            why = str(status["exec_error"])[:200]
            if status.get("errno") == errno.EACCES:
                raise ProviderUnsupported(self.name, action, f"cannot execute {str(self.script(action))!r}: {why}")
            raise ProviderCrashed(self.name, action, f"cannot start {str(self.script(action))!r}: {why}")
        if len(stdout) > limits.max_output or (status or {}).get("too_large"):
            raise ProviderProtocolViolation(
                self.name, action, f"stdout exceeds {limits.max_output} bytes; the plugin was killed"
            )
        if timed_out:
            raise ProviderTimeout(
                self.name,
                action,
                f"no answer within {deadline:g} s; the process group was killed{self._stderr(tail, redact)}",
            )
        code = _exit_code(status)
        if code is None:
            if returncode is None or returncode >= 0:
                raise ProviderCrashed(
                    self.name, action, f"the plugin's wrapper ended without a status{self._stderr(tail, redact)}"
                )
            code = returncode  # the wrapper itself was killed (the group's SIGKILL)
        if code == 0:
            return self._success(action, stdout, tail, redact, validate)
        raise self._failure(action, code, stdout, tail, redact)

    def _success(self, action: str, stdout: bytes, tail: StderrTail, redact: Redactor, validate: bool) -> Any:
        try:
            document = parse_json(stdout)
        except ValueError:
            raise ProviderProtocolViolation(
                self.name, action, f"stdout is not JSON: {snippet(stdout, redact)}{self._stderr(tail, redact)}"
            ) from None
        return check_output(self.name, action, document, redact, parsed=True) if validate else document

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


def _stderr_keep(tail: int) -> int:
    """Bytes of stderr the wrapper keeps at least: four times the tail, so the redacted tail is cut from whole
    text (redact, then truncate) however much the secrets shrink it."""
    return max(4 * tail, 16 << 10)


def _exit_code(status: Mapping[str, Any] | None) -> int | None:
    if status is None:
        return None
    if isinstance(status.get("exit"), int):
        return int(status["exit"])
    if isinstance(status.get("signal"), int):
        return -int(status["signal"])
    return None


def _read_head(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def _read_tail(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                f.seek(size - limit)
            return f.read(limit)
    except OSError:
        return b""


def op_of(document: Mapping[str, Any]) -> str:
    """The op a call is about: its ``op_id``, or the ``provisionerd:op`` its tags filter on ("" for none)."""
    op = document.get("op_id")
    if isinstance(op, str):
        return op
    tags = document.get("tags")
    found = tags.get("provisionerd:op") if isinstance(tags, Mapping) else None
    return found if isinstance(found, str) else ""


def _log_collected(provider: str, done: Collected) -> None:
    """What became of a call an earlier process left (its errors are redacted already)."""
    if not done.started:
        log.info("provider %s: %s of op %r, left by an earlier process, never started", provider, done.action, done.op)
    elif done.error is not None:
        log.warning(
            "provider %s: %s of op %r, left by an earlier process: %s", provider, done.action, done.op, done.error
        )
    else:
        request_id = done.document.get("requestId") if isinstance(done.document, dict) else None
        log.warning(
            "provider %s: %s of op %r, left by an earlier process, succeeded (requestId %r)",
            provider,
            done.action,
            done.op,
            request_id,
        )
