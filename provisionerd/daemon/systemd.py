"""The daemon under systemd (``Type=notify``, ``contrib/systemd/provisionerd.service``): READY, STATUS, WATCHDOG,
STOPPING through ``telemetry.sd_notify``.

READY=1 is sent when the daemon is up: every task of ``DaemonCore.run`` started, the admin socket listening, the
controller session started. Not when joined and resynced: the controller may be down for as long as it likes, and
the daemon's answer to that is to keep trying with back-off while it keeps its machines; a unit that waited for the
join would fail its start after ``TimeoutStartSec`` and restart in a loop, losing the back-off and its ``instance``
each time. Whether the daemon is joined, resynced and holds its leases is in ``STATUS=`` (``systemctl status``),
``provisionerd status`` and ``/readyz``.

WATCHDOG=1 is sent every half of ``WATCHDOG_USEC`` by a trio task, and only while the reconcile loop turns: its
``turns`` counter (every pass, planned or skipped: it passes at least every ``replan_interval``) must have moved
within ``stall_after`` seconds. A blocked trio thread sends nothing (this task does not run); a loop that stopped
turning gets no ping after ``stall_after``, a ``watchdog_stalled`` event and an ERROR line, and systemd kills and
restarts the daemon ``WatchdogSec`` later. STOPPING=1 goes out on SIGTERM, before the leases are released.

A reload (SIGHUP or ``provisionerd reload``) is bracketed by ``SystemdReloads``: ``RELOADING=1`` with
``MONOTONIC_USEC`` (CLOCK_MONOTONIC, as ``sd_notify(3)`` asks of it since systemd 253) before the file is read,
then ``READY=1`` with ``STATUS=`` naming the outcome and ``ERRNO=`` (``EINVAL`` when the reload failed, 0 when it
did not). Why both this and an ``ExecReload=`` command (``contrib/systemd/provisionerd.service``): the shipped
unit must work on Debian bookworm's systemd 252, which has no ``Type=notify-reload`` (253) and takes a reload's
result only from the ``ExecReload=`` command's exit status (``READY=1`` after ``RELOADING=1`` ends the reload
with success, whatever ``ERRNO=`` says). So ``ExecReload=provisionerd reload --socket ...`` asks the running
daemon over its admin socket and exits 1 when the reload failed, which makes ``systemctl reload`` fail; the
notifications keep ``systemctl status`` (STATUS, ERRNO) true, and a ``kill -HUP`` outside systemd is still seen
as a reload.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable

import trio

from provisionerd.config.loader import Config
from provisionerd.daemon.current_config import ReloadResult
from provisionerd.daemon.root import DaemonCore
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.sd_notify import SdNotifier

log = logging.getLogger("provisionerd.systemd")

#: Seconds between two STATUS= updates when the watchdog is off.
STATUS_INTERVAL = 30.0


class SystemdNotify:
    def __init__(
        self,
        notifier: SdNotifier,
        progress: Callable[[], int],
        status: Callable[[], str],
        events: EventLog,
        *,
        stall_after: float,
    ) -> None:
        self.notifier = notifier
        self.progress = progress
        self.status = status
        self.events = events
        self.stall_after = stall_after
        self.pings = 0
        self.stalled = False
        self._last_progress = 0
        self._last_change = 0.0
        self._last_status = ""

    @property
    def interval(self) -> float:
        watchdog = self.notifier.watchdog
        return watchdog / 2 if watchdog is not None else STATUS_INTERVAL

    async def run(self, *, task_status: trio.TaskStatus[SystemdNotify] = trio.TASK_STATUS_IGNORED) -> None:
        """Send READY=1 now, then STATUS= and WATCHDOG=1 until cancelled. Returns at once when not under systemd."""
        task_status.started(self)
        if not self.notifier.enabled:
            return
        self._last_progress, self._last_change = self.progress(), trio.current_time()
        self._last_status = self.status()
        self.notifier.send("READY=1", f"STATUS={self._last_status}")
        self.events.emit("systemd_ready", watchdog=self.notifier.watchdog)
        try:
            while True:
                self.tick()
                await trio.sleep(self.interval)
        finally:
            self.notifier.close()

    def tick(self) -> None:
        now, progress = trio.current_time(), self.progress()
        if progress != self._last_progress:
            self._last_progress, self._last_change = progress, now
            if self.stalled:
                self.stalled = False
                self.events.emit("watchdog_resumed")
        lines = []
        status = self.status()
        if status != self._last_status:
            self._last_status = status
            lines.append(f"STATUS={status}")
        if self.notifier.watchdog is not None:
            idle = now - self._last_change
            if idle <= self.stall_after:
                lines.append("WATCHDOG=1")
                self.pings += 1
            elif not self.stalled:
                self.stalled = True
                log.error("the reconcile loop has not turned for %.0f s: no more watchdog pings", idle)
                self.events.emit("watchdog_stalled", idle=round(idle, 3), stall_after=self.stall_after)
        self.notifier.send(*lines)

    def stopping(self) -> None:
        self.notifier.send("STOPPING=1", "STATUS=stopping: releasing leases")


class SystemdReloads:
    """A ``ReloadWatcher`` (``daemon.current_config``) that tells systemd of each reload (module docstring)."""

    def __init__(self, notifier: SdNotifier) -> None:
        self.notifier = notifier

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading the config")

    def reloaded(self, result: ReloadResult, config: Config) -> None:
        self.notifier.send("READY=1", f"STATUS={reload_status(result)}", f"ERRNO={reload_errno(result)}")


def reload_errno(result: ReloadResult) -> int:
    """``EINVAL`` for a failed reload (the running config kept), else 0 (clears an earlier failure's)."""
    return errno.EINVAL if result.outcome == "failed" else 0


def reload_status(result: ReloadResult, limit: int = 200) -> str:
    """The one-line ``STATUS=`` after a reload: its outcome, and the first problem or what waits for a restart."""
    if result.outcome == "failed":
        text = f"reload failed, running config kept: {result.problems[0] if result.problems else 'unknown'}"
    elif result.restart_needed:
        text = f"reload {result.outcome}; restart needed for: {', '.join(result.restart_needed)}"
    else:
        text = f"reload {result.outcome}: {', '.join(result.applied) or 'nothing changed'}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def core_status(core: DaemonCore) -> str:
    """The one-line ``STATUS=``: link, leases held, plan passes."""
    now = trio.current_time()
    held = sum(1 for keeper in core.keepers.values() if keeper.valid(now))
    halted = " (halted: controller amnesia)" if core.guard.finding is not None else ""
    return f"link {core.session.state.value}; leases {held}/{len(core.keepers)} held; plans {core.loop.cycles}{halted}"


def for_core(core: DaemonCore, notifier: SdNotifier | None = None) -> SystemdNotify:
    """The notifier of a running daemon (``provisionerd run``): the loop's ``turns`` as its progress."""
    notifier = notifier if notifier is not None else SdNotifier.from_env()
    replan = core.loop.settings.replan_interval
    stall_after = max(3 * replan, notifier.watchdog or 0.0)
    return SystemdNotify(
        notifier, lambda: core.loop.turns, lambda: core_status(core), core.events, stall_after=stall_after
    )
