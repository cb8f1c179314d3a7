"""The machines this daemon has seen joined, kept where a restart finds them (issue 31, finding 1).

A controller's host table is volatile, and so is the daemon's memory: after a daemon restart and a controller
restart together, nothing in memory says which machines had joined, and a machine whose worker is slow to rejoin
(or gone) would be returned as never joined. ``JoinedRefs`` is the set of instance refs seen with a host; with a
path it is also a file, ``<state_dir>/joined.<cluster>.txt``, one instance ref a line:

- a ref is appended (one ``write`` of the new lines, no fsync: losing the last lines in a crash only costs the
  settle window for those machines) the first time it is seen;
- ``prune(keep)`` rewrites the file atomically (``write_atomic``) with only the refs kept, so the file stays the
  size of the live fleet;
- at start the file is read whole (at most ``MAX_FILE`` bytes). A line that is not a ref (too long, a control
  character) is skipped and counted in ``refused``, which the daemon logs at WARNING; an unreadable file is
  ``StateFileDamaged``, as for the controller state file. Refs are the controller's ``instanceRef`` strings.

Written only from the event loop; the file is created 0600 in a 0700 directory (``open_private``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Set
from pathlib import Path

from provisionerd.domain.errors import StateFileDamaged
from provisionerd.telemetry.files import open_private, write_atomic

log = logging.getLogger(__name__)

#: Longest instance ref kept (the protocol's text bound is far above any real one).
MAX_REF = 1024
#: Largest file read at start: 1,000,000 refs of 100 bytes.
MAX_FILE = 128 << 20


def _is_ref(text: str) -> bool:
    return 0 < len(text) <= MAX_REF and text.isprintable()


class JoinedRefs(Set[str]):
    """A set of instance refs, appended to its file (if any) as it grows."""

    def __init__(self, path: Path | None = None, refs: Iterable[str] = ()) -> None:
        self.path = path
        self._refs: set[str] = set(refs)
        #: Lines of the file that were not refs when it was read (logged and counted by the daemon).
        self.refused = 0
        #: Writes that failed (a full disk, say): the set in memory is whole, the file behind (logged at ERROR).
        self.write_failures = 0

    @classmethod
    def load(cls, path: Path) -> JoinedRefs:
        """The set in the file at ``path`` (empty when there is none). Raises ``StateFileDamaged``."""
        try:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_FILE + 1)
        except FileNotFoundError:
            return cls(path)
        except OSError as exc:
            raise StateFileDamaged(str(path), f"cannot read it: {exc.strerror or exc}") from None
        if len(raw) > MAX_FILE:
            raise StateFileDamaged(str(path), f"larger than {MAX_FILE} bytes")
        refs, refused = [], 0
        for line in raw.split(b"\n"):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                text = "\x00"  # not a ref
            if _is_ref(text):
                refs.append(text)
            elif line:
                refused += 1
        joined = cls(path, refs)
        joined.refused = refused
        return joined

    def __contains__(self, ref: object) -> bool:
        return ref in self._refs

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def add(self, ref: str) -> None:
        if ref not in self._refs:
            self.update((ref,))

    def update(self, refs: Iterable[str]) -> None:
        """Add ``refs``; the new ones are appended to the file. A ref that is not one (``_is_ref``) is kept in
        memory but never written: the file stays readable line by line. A failed write is logged and counted,
        never raised: it must not cost the link it came from."""
        new = [ref for ref in refs if ref not in self._refs]
        if not new:
            return
        self._refs.update(new)
        lines = "".join(f"{ref}\n" for ref in new if _is_ref(ref))
        if self.path is not None and lines:
            try:
                fd = open_private(self.path)
                try:
                    data = memoryview(lines.encode())
                    while data:
                        data = data[os.write(fd, data) :]
                finally:
                    os.close(fd)
            except OSError as exc:
                self._failed("append to", exc)

    def prune(self, keep: Set[str]) -> None:
        """Keep only the refs in ``keep``; the file is rewritten atomically (a failure is logged and counted)."""
        self._refs &= keep
        if self.path is not None:
            try:
                write_atomic(self.path, "".join(f"{ref}\n" for ref in sorted(self._refs) if _is_ref(ref)).encode())
            except OSError as exc:
                self._failed("rewrite", exc)

    def _failed(self, what: str, exc: OSError) -> None:
        self.write_failures += 1
        log.error(
            "cannot %s %s (%s failure(s) so far): %s; machines seen joined since are known to this process only",
            what,
            self.path,
            self.write_failures,
            exc.strerror or exc,
        )
