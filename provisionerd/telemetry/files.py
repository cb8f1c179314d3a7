"""Files and directories the daemon creates, with modes that do not depend on the umask.

Under ``umask 000`` a plain ``mkdir(parents=True)`` makes 0777 directories and ``open("a")`` a 0666 file (issue
16: a local user then swapped the admin socket for a fake one). So every directory the daemon creates for its
state, logs or socket is made 0700 and every file 0600, both set explicitly after creation (``mkdir`` then
``chmod``, ``os.open`` with the mode then ``fchmod``): the umask can then neither widen nor narrow them.
Directories that exist already are not changed (they may be ``/var/log``); the admin socket's directory is
checked instead (``check_private_dir``) and the daemon refuses to start on one another user could change.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from provisionerd.domain.errors import InsecurePath
from provisionerd.plugin_sdk.atomic import write_private

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing ancestors, each mode 0700 (set explicitly). Raises ``OSError``."""
    missing: list[Path] = []
    here = path
    while not here.exists():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:  # made meanwhile by someone else: not ours to chmod, check_private_dir decides
            continue
        os.chmod(directory, DIR_MODE)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """``os.open`` a file the daemon owns: created 0600, made 0600 if it existed with another mode, never through
    a symbolic link (one planted at the path could point anywhere). Its directory is created (``make_private_dir``)
    if missing. Returns the descriptor; raises ``OSError``."""
    make_private_dir(path.parent)
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, its directory made 0700 if missing: the one atomic writer
    (``plugin_sdk.atomic.write_private``: a 0600 temporary file, fsync, rename, fsync of the directory). A crash
    leaves the old file or the new one, never a mix. Raises ``OSError``."""
    make_private_dir(path.parent)
    write_private(path, data)


def check_private_dir(path: Path, uid: int | None = None) -> None:
    """Raise ``InsecurePath`` unless only ``uid`` (default: our effective uid) can change what is in ``path``:
    ``path`` itself owned by ``uid`` and writable by nobody else, and each ancestor owned by ``uid`` or root and
    not writable by others unless sticky (``/tmp``: no one may rename another user's entry there)."""
    uid = os.geteuid() if uid is None else uid
    path = Path(os.path.abspath(path))
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise InsecurePath(str(path), f"cannot be checked: {exc.strerror}") from None
    problem = dir_problem(info.st_mode, info.st_uid, uid, own=True)
    if problem:
        raise InsecurePath(str(path), problem)
    for ancestor in path.parents:
        info = os.stat(ancestor)
        problem = dir_problem(info.st_mode, info.st_uid, uid, own=False)
        if problem:
            raise InsecurePath(str(ancestor), f"{problem} (an ancestor of {str(path)!r})")


def dir_problem(mode: int, owner: int, uid: int, *, own: bool) -> str | None:
    """What makes a directory unsafe to trust (None: nothing). ``own``: the directory holding our file (it must be
    ours and writable by nobody else); else an ancestor (ours or root's; others may write only if it is sticky)."""
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if own:
        if owner != uid:
            return f"is owned by uid {owner}, not by the daemon's uid {uid}"
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"is writable by group or others (mode {stat.S_IMODE(mode):04o}; it must be 0700)"
        return None
    if owner not in (uid, 0):
        return f"is owned by uid {owner}, neither the daemon's uid {uid} nor root"
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return f"is writable by group or others and not sticky (mode {stat.S_IMODE(mode):04o})"
    return None
