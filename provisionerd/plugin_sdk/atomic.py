"""One atomic writer for private files: the plugins' stores and the daemon's own state files use it.

``write_private`` writes a temporary file beside the target (created with ``mode``, 0600 by default, whatever the
umask; never through a symbolic link), fsyncs it, renames it over the target and fsyncs the directory. A reader sees
the old file or the new one, never a part of either; once it returned, the new one survives a crash of the machine.
``durable=False`` skips both fsyncs, for state whose last write may be lost to a power cut (it only paces work).

Standard library ``os`` only, no ``json`` or ``pathlib`` at import: the daemon's one-shot call wrapper imports this
module on every plugin call, where each millisecond of start-up counts.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

PRIVATE_FILE = 0o600
_serial = itertools.count()  # unique temporary names between the threads of one process


def write_private(path: str | os.PathLike[str], data: bytes, *, durable: bool = True, mode: int = PRIVATE_FILE) -> None:
    """Replace ``path`` with ``data`` atomically, as a file of ``mode``. Raises ``OSError``; then ``path`` is as it
    was and no temporary file is left."""
    target = os.fspath(path)
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{next(_serial)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits away
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_private_json(
    path: str | os.PathLike[str], document: Any, *, durable: bool = True, sort_keys: bool = False
) -> None:
    """``write_private`` of ``document`` as compact JSON (UTF-8). Raises ``OSError``, or ``TypeError`` for a
    value JSON cannot hold (then nothing is written)."""
    import json  # here, not at import: see the module docstring

    text = json.dumps(document, separators=(",", ":"), sort_keys=sort_keys)
    write_private(path, text.encode(), durable=durable)
