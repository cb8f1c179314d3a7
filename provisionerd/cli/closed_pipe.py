"""A command whose reader went away (``provisionerd status | head -1``) ends quietly, as ``cat`` would.

Python ignores SIGPIPE, so a write to a pipe whose reader has exited raises ``BrokenPipeError``, in the command's
``print`` or in the interpreter's final flush of stdout, and prints a traceback. ``quiet_on_closed_pipe(run)``
runs the command, flushes stdout itself, and on a closed pipe points stdout at ``/dev/null`` (so the final flush has
nowhere to fail) and returns ``CLOSED_PIPE``: 141, the status a shell gives a command killed by SIGPIPE, which
``set -o pipefail`` scripts already recognise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

CLOSED_PIPE = 128 + 13  # 128 + SIGPIPE


def quiet_on_closed_pipe(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or ``CLOSED_PIPE`` without a traceback when stdout's reader has gone."""
    try:
        code = run()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # stdout is not a file descriptor (a test's buffer): nothing to redirect
            pass
        return CLOSED_PIPE
