"""The store's write transactions: ``BEGIN IMMEDIATE`` ... ``COMMIT``, a storage failure typed as ``StoreFailure``
after the rollback, and the test-only page limit (see ``refcontroller.store``: "Storage failures", "Test-only page
limit")."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

#: The file whose number is applied as ``PRAGMA max_page_count`` before each write (tests only).
PAGE_LIMIT_ENV = "REFCONTROLLER_TEST_PAGE_LIMIT_FILE"
NO_PAGE_LIMIT = 1073741823  # SQLite's default max_page_count


class StoreFailure(Exception):
    """A write could not be made durable (SQLite's error in ``str()``); its transaction was rolled back."""


class Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or ``ROLLBACK`` on error); nested use joins the outer transaction.

    Every committed transaction also counts one change (``meta.changes``, in the same transaction) and then says so
    in ``committed`` (true once the outer ``COMMIT`` succeeded), which the store reads to rewrite its mark. An
    ``sqlite3.OperationalError`` (disk full, I/O error, read-only) anywhere in the outer transaction, its ``COMMIT``
    included, rolls it back and is raised as ``StoreFailure``. ``page_limit``: the test-only limit file (module
    docstring), read before ``BEGIN``."""

    def __init__(self, conn: sqlite3.Connection, page_limit: Path | None = None) -> None:
        self._conn = conn
        self._outer = False
        self._page_limit = page_limit
        #: True once this transaction was the outer one and its ``COMMIT`` succeeded.
        self.committed = False

    def __enter__(self) -> None:
        self._outer = not self._conn.in_transaction
        if self._outer:
            try:
                if self._page_limit is not None:
                    _apply_page_limit(self._conn, self._page_limit)
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreFailure(str(exc)) from exc

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        if exc_type is not None:
            self._rollback()
            if isinstance(exc, sqlite3.OperationalError):
                raise StoreFailure(str(exc)) from exc
            return
        try:
            self._conn.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'changes'")
            self._conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._rollback()
            raise StoreFailure(str(exc)) from exc
        except BaseException:
            self._rollback()
            raise
        self.committed = True

    def _rollback(self) -> None:
        # SQLite may have rolled the transaction back itself (SQLITE_FULL does, for some statements).
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


def page_limit_file() -> Path | None:
    name = os.environ.get(PAGE_LIMIT_ENV)
    return Path(name) if name else None


def _apply_page_limit(conn: sqlite3.Connection, limit_file: Path) -> None:
    try:
        text = limit_file.read_text(encoding="ascii").strip()[:20]
    except (OSError, UnicodeDecodeError):
        text = ""
    limit = int(text) if text.isdigit() else NO_PAGE_LIMIT
    conn.execute(f"PRAGMA max_page_count = {max(1, min(limit, NO_PAGE_LIMIT))}")
