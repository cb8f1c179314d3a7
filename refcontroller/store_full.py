"""Telling a full disk from a damaged store when the store cannot be opened.

SQLite opening a store in WAL mode creates ``-wal`` and ``-shm`` beside it; on a full file system that fails as
``disk I/O error`` (SQLite's ``SQLITE_IOERR`` hides the ``ENOSPC``), which the controller used to report as "is
damaged" (issue 33). Nothing is damaged: freeing space is the fix, and the operator must be told so. The file
system's free space (``os.statvfs``) decides: below ``FULL_BELOW`` bytes available, or SQLite's own
``SQLITE_FULL``, the store is reported full.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

#: Bytes available under which a failed open is put down to a full disk (a store needs pages, a WAL and its index).
FULL_BELOW = 1 << 20
_SQLITE_FULL = 13


def free_bytes(directory: Path, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> int | None:
    """Bytes available to this user on ``directory``'s file system (``None``: cannot tell)."""
    try:
        st = statvfs(str(directory))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_full(path: Path, exc: BaseException, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> bool:
    """Whether ``exc``, met opening the store at ``path``, comes from a full file system."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL:
        return True
    free = free_bytes(path.parent, statvfs)
    return free is not None and free < FULL_BELOW


def describe_open_failure(
    path: Path, exc: BaseException, statvfs: Callable[[str], os.statvfs_result] = os.statvfs
) -> str:
    """One line for ``StoreRefused``: the disk is full (with the bytes left), or the store is damaged."""
    if is_full(path, exc, statvfs):
        free = free_bytes(path.parent, statvfs)
        left = f"{free} bytes available" if free is not None else "no space available"
        return (
            f"store {str(path)!r} cannot be opened: the disk is full ({left} on {str(path.parent)!r}; SQLite said:"
            f" {exc}): free space and start again"
        )
    return f"store {str(path)!r} is damaged: {exc}"
