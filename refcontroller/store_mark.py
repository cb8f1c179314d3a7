"""The store's mark: ``<file>.mark`` beside the SQLite file, saying which incarnation the store is and how far it
got (changes, term, last fact index), rewritten atomically after every write. A store behind its mark lost writes
(a write-ahead log lost with a kill -9, an older copy restored); ``refcontroller.store.FactStore.open`` refuses it
with ``StoreRefused`` (one line naming the path)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import attrs

MARK_SUFFIX = ".mark"
MAX_MARK = 4096  # bytes: a mark is one short JSON object


class StoreRefused(Exception):
    """The store cannot be trusted (damaged, lost, behind its mark); ``str()`` is one line naming the path."""


@attrs.frozen
class Mark:
    """What ``<file>.mark`` says the store holds at least. ``changes`` 0: created, nothing written yet."""

    incarnation: str
    changes: int
    term: int
    last_index: int

    def describe(self) -> str:
        return f"incarnation {self.incarnation}, change {self.changes}, term {self.term}, last index {self.last_index}"


def new_incarnation_id() -> str:
    """A fresh incarnation id: 32 hex characters from the OS's randomness."""
    return secrets.token_hex(16)


def mark_path(path: Path) -> Path:
    return path.with_name(path.name + MARK_SUFFIX)


def read_mark(path: Path) -> Mark | None:
    """The mark at ``path`` (``None`` if there is none); ``StoreRefused`` if it cannot be read or makes no sense."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_MARK + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreRefused(f"cannot read the store's mark {str(path)!r}: {exc.strerror or exc}") from None
    try:
        if len(raw) > MAX_MARK:
            raise ValueError(f"more than {MAX_MARK} bytes")
        doc = json.loads(raw)
        mark = Mark(
            incarnation=doc["incarnation"], changes=doc["changes"], term=doc["term"], last_index=doc["last_index"]
        )
        if not isinstance(mark.incarnation, str) or not 0 < len(mark.incarnation) <= 64:
            raise ValueError("incarnation must be 1..64 characters")
        if not all(type(v) is int and v >= 0 for v in (mark.changes, mark.term, mark.last_index)):
            raise ValueError("changes, term and last_index must be non-negative integers")
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreRefused(f"the store's mark {str(path)!r} is damaged: {exc}") from None
    return mark


def write_mark(path: Path, mark: Mark) -> None:
    """Replace the mark atomically (a private temporary file, fsync, rename): a reader sees the old or the new."""
    text = json.dumps(attrs.asdict(mark), sort_keys=True) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
