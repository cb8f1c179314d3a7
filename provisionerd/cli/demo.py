"""``provisionerd demo [--workers N] [--json] [--keep]``: the whole system on this host, end to end.

Needs nothing but this checkout (installed): certificates, a three-replica reference controller, the daemon and
the local provider's worker agents all run here, under a temporary directory that is removed at the end. See
:mod:`provisionerd.demo` for the steps.

Output: the story and a live status on stdout (redrawn in place on a terminal, plain lines otherwise), then a
summary. With ``--json`` the story goes to stderr and stdout gets one line, the summary::

    {"ok": true, "requested": N, "joined": N, "returned": N, "failovers": 1, "orphans_reported": 1, "leaked": 0,
     "seconds": S}

(when not ok, ``failed_step`` and ``error`` are added). ``leaked`` counts agent processes of this run alive that no
fact explains. Ctrl-C or SIGTERM stops the demo and cleans up (the daemon, the controller, every agent, the
directory). Exit codes: 0 ok; 1 a step failed (it is named, with the reason); 2 bad arguments; 128 + the signal
number when interrupted.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

import trio

from provisionerd.demo.progress import Progress
from provisionerd.demo.run import Summary, run_demo

MAX_WORKERS = 48


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_WORKERS}, not {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provisionerd demo", description="run the whole system on this host")
    parser.add_argument("--workers", type=_workers, default=8, help="how many workers to ask for (default 8)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, facts)")
    return parser


async def _main(workers: int, progress: Progress, keep: bool) -> tuple[Summary, int]:
    """Run the demo; the first SIGINT/SIGTERM cancels the script (later ones are ignored while it cleans up)."""
    caught: list[int] = []
    script = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    if not caught:
                        caught.append(signum)
                        progress.say(f"==> {signal.Signals(signum).name}: stopping")
                        script.cancel()

            def name() -> str:
                return signal.Signals(caught[0]).name if caught else ""

            nursery.start_soon(watch)
            summary = await run_demo(workers, progress, script, keep=keep, interrupted=name)
            nursery.cancel_scope.cancel()
    return summary, (caught[0] if caught else 0)


def describe(summary: Summary, workers: int) -> list[str]:
    """The human summary."""
    s = summary
    head = (
        f"provisionerd demo: ok in {s.seconds:.1f} s"
        if s.ok
        else f"provisionerd demo: FAILED in step {s.failed_step!r} after {s.seconds:.1f} s: {s.error}"
    )
    lines = [
        head,
        f"  workers: {s.requested} requested, {s.joined} joined, {s.returned} returned (asked for {workers})",
        f"  controller failovers: {s.failovers}; orphans reported: {s.orphans_reported}; "
        f"leaked agent processes: {s.leaked}",
    ]
    if s.steps:
        lines.append("  steps: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in s.steps))
    return lines


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    out = sys.stderr if args.json else sys.stdout
    progress = Progress(out, tty=out.isatty(), workers=args.workers)
    try:
        summary, signum = trio.run(_main, args.workers, progress, args.keep)
    except KeyboardInterrupt:  # before the signal handlers were in place: nothing was started yet
        return 128 + signal.SIGINT
    finally:
        progress.close()
    for line in describe(summary, args.workers):
        print(line, file=out)
    if args.json:
        print(json.dumps(summary.document()), flush=True)
    if signum:
        return 128 + signum
    return 0 if summary.ok else 1
