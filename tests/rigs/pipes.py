"""A process driven over its pipes by a test: a provider plugin (one-shot or persistent) or a CLI whose output the
test reads, in its own session, its group killed for sure.

Unlike ``rigs.procs``, the environment is given whole, not added to this process's: a plugin gets exactly the
environment the daemon would give it, so a test proves it needs nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def piped(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdin: int = subprocess.PIPE,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with pipes for stdout and stderr (and stdin unless ``stdin`` says
    otherwise); ``env`` replaces the environment (``None``: this process's)."""
    return subprocess.Popen(
        [str(a) for a in argv],
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process's whole group (what it forked too); it is reaped by the caller's ``communicate`` or
    ``wait``."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def communicate(process: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, bytes, bytes]:
    """``(exit code, stdout, stderr)`` once it ends; after ``timeout`` its group is killed and the code is
    ``None``."""
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        return None, out, err
