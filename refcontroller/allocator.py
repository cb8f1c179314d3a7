"""The serving process's allocator: glibc's ``malloc`` for every Python object, so that a flood's memory goes back.

CPython keeps small objects in its own 1 MiB arenas (pymalloc) and returns an arena to the system only once every
object in it is freed. After a connection flood, the few objects that outlive it are spread over many arenas, and
those stay resident: ``bench/flood.py`` (three floods of 1600 connections, 440 MiB at the peak) measured the idle
controller at 53 MiB and, 60 s after the last flood, still 68-74 MiB (1.3-1.4 times) with pymalloc, every closed
connection's cycles collected and ``malloc_trim`` run (``gate.return_memory``). With ``PYTHONMALLOC=malloc`` the
same run ends at 59 MiB (1.1 times): glibc's ``malloc_trim`` gives back every free page, wherever it is. The price
is CPU: decoding a fact from the store's JSON takes about 11% longer (5.2 -> 5.8 us).

The allocator is chosen when the interpreter starts, so ``refcontroller serve`` run from a command line re-executes
itself once (same process id, same arguments) with ``PYTHONMALLOC=malloc`` unless ``PYTHONMALLOC`` is set already:
any value is the operator's choice and kept (``PYTHONMALLOC=pymalloc`` keeps CPython's allocator).
"""

from __future__ import annotations

import os
import sys

ENV = "PYTHONMALLOC"


def serve_with_malloc(argv: list[str]) -> None:
    """Re-execute ``python -m refcontroller ARGV`` with ``PYTHONMALLOC=malloc``; returns (doing nothing) when the
    variable is set (the re-executed process has it), off Linux, or without a known interpreter."""
    if os.environ.get(ENV) is not None or not sys.platform.startswith("linux") or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "refcontroller", *argv], {**os.environ, ENV: "malloc"})
