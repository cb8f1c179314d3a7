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
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

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
