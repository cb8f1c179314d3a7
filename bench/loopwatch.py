"""Run a trio program with its loop watched: the longest task steps and what each orphan pass cost.

Run as ``python bench/loopwatch.py OUT.json -m provisionerd run --config FILE`` (what ``steady.py`` does): the
rest of the command line is run as ``python -m ...`` would run it, with ``trio.run`` given one more instrument.
Nothing in the daemon changes; this is the bench's own view of it. ``OUT.json`` is rewritten after every orphan
pass and when the program exits:

- ``max_step_ms`` / ``max_step_cpu_ms``: the longest single task step, by wall time and by CPU time of the loop's
  thread (on a shared machine the wall figure includes time the OS gave the core to other processes, and time
  spent waiting for the GIL a worker thread held), each with its task's name (``max_step_task``,
  ``max_step_cpu_task``); ``steps_over_20ms`` and ``steps_over_20ms_cpu``: how many steps took longer than 20 ms;
- ``passes``: for each orphan pass (``OrphanCycle.run_pass``) its wall time, ``cpu_s`` (the whole process's CPU
  time over the pass, worker threads included, less what the steps of other tasks cost meanwhile: the heartbeats,
  reclaim polls and admin queries that ran beside it), its own longest step and ``gc_s``, the time the cyclic
  collector ran meanwhile (in any thread); ``max_gc_ms``: the longest collection, and its generation;
- ``slow_steps``: the first ``KEPT_SLOW`` steps over 20 ms of CPU, each as ``[seconds since the start, task, CPU ms,
  collector ms]`` (when a slow step came: start-up, a pass, a poll);
- ``long_steps``: the first ``KEPT_LONG`` steps over ``SAMPLE_AFTER`` (12 ms) of CPU with where the loop's thread
  was while they ran: a ``SIGALRM`` timer armed for ``SAMPLE_AFTER`` of wall time at the start of every step (and
  disarmed at its end) samples the running frame, then again every ``SAMPLE_EVERY``; each sample is the innermost
  frames (``file:line function``, innermost last). The handler runs between bytecodes, so a sample taken during a
  long C call names the line that made it. Two ``setitimer`` calls a step; the daemon's code is not changed.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio

LIMIT = 0.020
#: How many slow steps ``slow_steps`` keeps (the first ones).
KEPT_SLOW = 60
#: A step sampled once it has run this long (wall), then every ``SAMPLE_EVERY``; kept if its CPU passed it too.
SAMPLE_AFTER = 0.012
SAMPLE_EVERY = 0.003
KEPT_LONG = 40
#: Frames kept per sample (innermost).
SAMPLE_DEPTH = 8


class Watch(trio.abc.Instrument):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.max_step = (0.0, "")
        self.max_cpu = (0.0, "")
        self.over = 0
        self.over_cpu = 0
        self.by_task: dict[str, float] = {}  # task name -> its longest step (wall)
        self.by_task_cpu: dict[str, float] = {}  # task name -> its longest step (CPU of the loop's thread)
        self.passes: list[dict[str, Any]] = []
        self._started: tuple[float, float] = (0.0, 0.0)
        self._pass_task: trio.lowlevel.Task | None = None
        self._others_cpu = 0.0  # CPU of other tasks' steps during the current pass
        self._pass_step = 0.0
        self._gc_started = 0.0
        self.gc_max = (0.0, -1)  # the longest collection (seconds, generation)
        self._pass_gc = 0.0  # collection time during the current pass
        self._step_gc = 0.0  # collection time in the loop's thread during the current step
        self._loop_thread = threading.get_ident()
        self.by_task_cpu_without_gc: dict[str, float] = {}
        self.slow_steps: list[list[Any]] = []
        self._t0 = time.perf_counter()
        gc.callbacks.append(self._collecting)
        self.long_steps: list[dict[str, Any]] = []
        self._samples: list[list[str]] = []
        signal.signal(signal.SIGALRM, self._sample)

    def _sample(self, signum: int, frame: Any) -> None:
        stack: list[str] = []
        while frame is not None and len(stack) < SAMPLE_DEPTH:
            code = frame.f_code
            stack.append(f"{'/'.join(code.co_filename.split('/')[-2:])}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        self._samples.append(stack[::-1])

    def _collecting(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        if took > self.gc_max[0]:
            self.gc_max = (took, info["generation"])
        if self._pass_task is not None:
            self._pass_gc += took
        if threading.get_ident() == self._loop_thread:
            self._step_gc += took

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = (time.perf_counter(), time.thread_time())
        self._step_gc = 0.0
        self._samples = []
        signal.setitimer(signal.ITIMER_REAL, SAMPLE_AFTER, SAMPLE_EVERY)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        wall = time.perf_counter() - self._started[0]
        cpu = time.thread_time() - self._started[1]
        if cpu > SAMPLE_AFTER and len(self.long_steps) < KEPT_LONG:
            self.long_steps.append(
                {
                    "at_s": round(self._started[0] - self._t0, 1),
                    "task": task.name.split(".")[-1],
                    "cpu_ms": round(1000 * cpu, 1),
                    "gc_ms": round(1000 * self._step_gc, 1),
                    "samples": self._samples,
                }
            )
        if wall > self.max_step[0]:
            self.max_step = (wall, task.name)
        if cpu > self.max_cpu[0]:
            self.max_cpu = (cpu, task.name)
        if wall > self.by_task.get(task.name, 0.0):
            self.by_task[task.name] = wall
        if cpu > self.by_task_cpu.get(task.name, 0.0):
            self.by_task_cpu[task.name] = cpu
        if cpu - self._step_gc > self.by_task_cpu_without_gc.get(task.name, 0.0):
            self.by_task_cpu_without_gc[task.name] = cpu - self._step_gc
        self.over += wall > LIMIT
        self.over_cpu += cpu > LIMIT
        if cpu > LIMIT and len(self.slow_steps) < KEPT_SLOW:
            when = round(self._started[0] - self._t0, 1)
            self.slow_steps.append([when, task.name, round(1000 * cpu, 1), round(1000 * self._step_gc, 1)])
        if self._pass_task is not None:
            if task is self._pass_task:
                self._pass_step = max(self._pass_step, wall)
            else:
                self._others_cpu += cpu

    def pass_started(self) -> tuple[float, float]:
        self._pass_task = trio.lowlevel.current_task()
        self._others_cpu = 0.0
        self._pass_step = 0.0
        self._pass_gc = 0.0
        return time.perf_counter(), time.process_time()

    def pass_ended(self, started: tuple[float, float]) -> None:
        wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
        self.passes.append(
            {
                "at_s": round(started[0] - self._t0, 1),
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu - self._others_cpu, 3),
                "others_cpu_s": round(self._others_cpu, 3),
                "max_step_ms": round(1000 * self._pass_step, 1),
                "gc_s": round(self._pass_gc, 3),
            }
        )
        self._pass_task = None
        self.write()

    def write(self) -> None:
        report = {
            "max_step_ms": round(1000 * self.max_step[0], 1),
            "max_step_task": self.max_step[1],
            "max_step_cpu_ms": round(1000 * self.max_cpu[0], 1),
            "max_step_cpu_task": self.max_cpu[1],
            "steps_over_20ms": self.over,
            "steps_over_20ms_cpu": self.over_cpu,
            "passes": self.passes,
            "slow_steps": self.slow_steps,
            "long_steps": self.long_steps,
            "max_gc_ms": round(1000 * self.gc_max[0], 1),
            "max_gc_generation": self.gc_max[1],
            "longest_by_task_ms": _top(self.by_task),
            "longest_by_task_cpu_ms": _top(self.by_task_cpu),
            "longest_by_task_cpu_without_gc_ms": _top(self.by_task_cpu_without_gc),
        }
        self.out.write_text(json.dumps(report))


def _top(longest: dict[str, float]) -> dict[str, float]:
    """The eight tasks with the longest steps, in ms, longest first (task names shortened to their last parts)."""
    ranked = sorted(longest.items(), key=lambda item: -item[1])[:8]
    return {".".join(name.split(".")[-2:]): round(1000 * seconds, 1) for name, seconds in ranked}


def main() -> None:
    out, module = Path(sys.argv[1]), sys.argv[3]
    assert sys.argv[2] == "-m", "usage: loopwatch.py OUT.json -m MODULE [ARGS...]"
    watch = Watch(out)
    atexit.register(watch.write)
    run = trio.run

    def watched_run(*args: Any, instruments: tuple[trio.abc.Instrument, ...] = (), **kwargs: Any) -> Any:
        return run(*args, instruments=(*instruments, watch), **kwargs)

    trio.run = watched_run  # type: ignore[assignment]

    from provisionerd.execution.orphan_cycle import OrphanCycle

    run_pass = OrphanCycle.run_pass

    async def watched_pass(self: OrphanCycle) -> Any:
        started = watch.pass_started()
        try:
            return await run_pass(self)
        finally:
            watch.pass_ended(started)

    OrphanCycle.run_pass = watched_pass  # type: ignore[method-assign]
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    os.umask(0o077)
    main()
