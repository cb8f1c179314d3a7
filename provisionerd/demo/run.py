"""``provisionerd demo``: the whole system on this host, for real, in well under a minute.

``run_demo`` runs the script of ``provisionerd.demo.script`` (certificates, the reference controller, the daemon with
the local provider, demand, a failover, an orphan, the drain, and a check of the controller's facts against the
processes) and returns its ``Summary``.

Clean-up always runs, also after a failure or an interrupt: the daemon, every agent of this run, the controller,
anything else that names the run's directory, then the directory itself.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd.demo.cluster import DemoError
from provisionerd.demo.procs import tail
from provisionerd.demo.progress import Progress
from provisionerd.demo.script import DemoRun
from provisionerd.domain.errors import ProvisionerdError

#: Worker agents' logs whose last lines a failed demo prints (one per worker by default, the planted orphan's too).
AGENT_LOGS_SHOWN = 9


@attrs.frozen
class Summary:
    ok: bool
    requested: int
    joined: int
    returned: int
    failovers: int
    orphans_reported: int
    leaked: int
    seconds: float
    failed_step: str = ""
    error: str = ""
    steps: tuple[tuple[str, float], ...] = ()

    def document(self) -> dict[str, Any]:
        """The ``--json`` line: exactly these keys when ok; ``failed_step`` and ``error`` added when not."""
        doc: dict[str, Any] = {
            "ok": self.ok,
            "requested": self.requested,
            "joined": self.joined,
            "returned": self.returned,
            "failovers": self.failovers,
            "orphans_reported": self.orphans_reported,
            "leaked": self.leaked,
            "seconds": self.seconds,
        }
        if not self.ok:
            doc.update(failed_step=self.failed_step, error=self.error)
        return doc


async def run_demo(
    workers: int,
    progress: Progress,
    cancel: trio.CancelScope,
    *,
    keep: bool = False,
    interrupted: Callable[[], str] = lambda: "",
) -> Summary:
    """Run the demo; ``cancel`` (cancelled on Ctrl-C/SIGTERM by the caller) stops the script, never the clean-up.
    ``interrupted()`` names the signal once there was one."""
    started = trio.current_time()
    run = DemoRun(workers, progress, Path(tempfile.mkdtemp(prefix="pd-demo-")))
    progress.say(f"provisionerd demo: {workers} workers; everything lives in {run.paths.root} (removed at the end)")
    failed_step = error = ""
    try:
        with cancel:
            async with trio.open_nursery() as nursery:
                await nursery.start(run.observer.run)
                try:
                    await run.script()
                finally:
                    nursery.cancel_scope.cancel()
        if cancel.cancelled_caught:
            failed_step, error = run.step, f"interrupted by {interrupted() or 'a signal'}"
    except (DemoError, ProvisionerdError, OSError, BaseExceptionGroup) as exc:
        cause = _only_cause(exc)
        if isinstance(cause, DemoError):
            failed_step, error = cause.step, cause.message
        elif isinstance(cause, (ProvisionerdError, OSError)):
            failed_step, error = run.step, f"{type(cause).__name__}: {cause}"
        else:
            raise
    finally:
        with trio.CancelScope(shield=True):
            progress.say("==> cleaning up" + (f" after the failure in step {failed_step!r}" if failed_step else ""))
            if failed_step and not cancel.cancelled_caught:
                for child in (run.daemon, run.controller):
                    if child is not None and child.log.exists():
                        progress.say(f"--- the end of {child.log.name}:\n{tail(child.log, 12)}")
                # The worker agents' own logs (the local provider's): a step that waits on the workers (joined,
                # rejoined after the failover, returned) fails for a reason only they know.
                for log in sorted((run.paths.local_data / "logs").glob("*.log"))[:AGENT_LOGS_SHOWN]:
                    progress.say(f"--- the end of agent log {log.name}:\n{tail(log, 4)}")
            for note in await run.cleanup(keep):
                progress.say(f"    {note}")
    c = (
        run.counts
        if run.verified
        else {
            "requested": run.observer.snapshot.requested,
            "joined": run.observer.snapshot.joined,
            "returned": run.observer.snapshot.returned,
        }
    )
    return Summary(
        ok=not failed_step,
        requested=c["requested"],
        joined=c["joined"],
        returned=c["returned"],
        failovers=run.failovers,
        orphans_reported=run.orphans_reported,
        leaked=run.leaked or 0,
        seconds=round(trio.current_time() - started, 1),
        failed_step=failed_step,
        error=error,
        steps=tuple(run.steps),
    )


def _only_cause(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups (what a nursery wraps a task's error in)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
