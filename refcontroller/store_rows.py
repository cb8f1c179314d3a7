"""Row checksums: every row of the SQLite store carries a CRC-32 of its own columns, written with it.

SQLite's ``quick_check`` reads a file's structure, not its content: a byte flipped inside a fact's body, a meta row
or a credential passes it, and the controller used to serve what it then failed to decode (issue 33: a traceback
for a flipped demand row, "internal error" on every resync for a flipped fact). So each table here has a
``rowsum`` column kept by two triggers (after an insert, and after an update of any other column), computed by the
``pvd_rowsum`` SQL function this module registers on every connection of the store. Every write path, the
lifecycle bookkeeping's ``UPDATE``\\ s included, is covered without a line of its own.

- **At open** (``verify``) every row of every table is checked; the first mismatch refuses the store with
  ``StoreRefused`` (one line naming the table and the row).
- **At run time** the reads of facts (with their commit times, ``fact_times``), meta, credentials, token claims,
  used tokens and rejoin proofs select the check with the row (``ok_column``) and ``checked`` raises
  :class:`StoreCorrupt` (a ``StoreFailure``: the request is answered ``storage_failure``, the link kept). The
  lifecycle tables are derived from the log: they are checked at every open only.
- **Stores written before checksums** (no ``rowsum`` column) are upgraded once when opened (``ensure``): the
  column is added and every row summed as found, in one transaction, with a warning; from then on every open
  checks them. A binary from before checksums can still read such a store, but each of its writes fails (its
  connection has no ``pvd_rowsum``: the trigger cannot run), so it never writes a row without its sum. A table
  added later (``fact_times``) is created without the column and gains it the same way, with its triggers, at the
  first open of the store by a binary that has the table (no row to sum yet, no warning).

CRC-32 detects every change confined to 32 consecutive bits, so every single flipped byte of a value; the sum
covers the table's name and each column's type and value (text as its bytes, so text that is no longer UTF-8 is
still summed rather than failing to decode).
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from refcontroller.store_tx import StoreFailure

log = logging.getLogger(__name__)

FUNCTION = "pvd_rowsum"

#: Every table's columns in summing order, each ``(name, "T")`` for text or ``(name, "N")`` for numbers; the
#: first column names a row in messages (never a token hash: ``used_tokens`` and ``token_claims`` are named by
#: their instance).
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "facts": (
        ("idx", "N"),
        ("provider", "T"),
        ("epoch_term", "N"),
        ("epoch_seq", "N"),
        ("holder", "T"),
        ("digest", "T"),
        ("body", "T"),
        ("ended_at", "N"),
    ),
    "fact_times": (("idx", "N"), ("at", "N")),
    "meta": (("key", "T"), ("value", "T")),
    "token_claims": (
        ("instance_ref", "T"),
        ("token_hash", "T"),
        ("provider", "T"),
        ("machine_id", "T"),
        ("hostname", "T"),
        ("address", "T"),
    ),
    "used_tokens": (("instance_ref", "T"), ("token_hash", "T"), ("used_at", "N")),
    "rejoin_hashes": (("instance_ref", "T"), ("rejoin_hash", "T"), ("token_hash", "T")),
    "worker_credentials": (
        ("instance_ref", "T"),
        ("credential_hash", "T"),
        ("issued_at", "N"),
        ("revoked", "T"),
        ("revoked_at", "N"),
        ("delivered_at", "N"),
    ),
    "lifecycle_ops": (
        ("origin", "T"),
        ("provider", "T"),
        ("wanted", "N"),
        ("made", "N"),
        ("closed", "N"),
        ("ended_at", "N"),
    ),
    "lifecycle_machines": (
        ("machine_id", "T"),
        ("provider", "T"),
        ("origin", "T"),
        ("instance_ref", "T"),
        ("gone", "N"),
    ),
    "lifecycle_members": (("origin", "T"), ("provider", "T"), ("idx", "N")),
    "lifecycle_mentions": (("machine_id", "T"), ("provider", "T"), ("kind", "T"), ("op_id", "T"), ("idx", "N")),
}


class StoreCorrupt(StoreFailure):
    """A row read back does not match the checksum written with it (or no longer decodes): a storage fault."""

    def __init__(self, table: str, row: object, detail: str = "fails its checksum") -> None:
        self.table = table
        self.row = row
        super().__init__(f"row {row!r} of table {table} {detail}: the store file was changed outside the controller")


def row_sum(table: str, *values: Any) -> int:
    """The checksum of one row: ``table`` and each value with its type, length-prefixed."""
    crc = zlib.crc32(table.encode())
    for value in values:
        if value is None:
            part = b"n"
        elif isinstance(value, bytes):
            part = b"t" + value
        elif isinstance(value, str):  # a text column not cast (should not happen): summed as its bytes
            part = b"t" + value.encode("utf-8", "surrogatepass")
        elif isinstance(value, int):
            part = b"i" + str(value).encode()
        elif isinstance(value, float):
            part = b"f" + value.hex().encode()
        else:
            part = b"?" + repr(value).encode()
        crc = zlib.crc32(len(part).to_bytes(4, "big") + part, crc)
    return crc


def install(conn: sqlite3.Connection) -> None:
    """Register ``pvd_rowsum`` on ``conn`` (every connection of the store, read-only ones included)."""
    conn.create_function(FUNCTION, -1, row_sum, deterministic=True)


def _sum_expr(table: str, prefix: str = "") -> str:
    args = [f"CAST({prefix}{name} AS BLOB)" if kind == "T" else f"{prefix}{name}" for name, kind in TABLES[table]]
    return f"{FUNCTION}('{table}', {', '.join(args)})"


def ok_column(table: str, alias: str = "") -> str:
    """A select-list expression that is 1 when the row's checksum matches (read it last, then ``checked``)."""
    prefix = f"{alias}." if alias else ""
    return f"({prefix}rowsum IS {_sum_expr(table, prefix)})"


def checked(table: str, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """The rows of a query whose last column is ``ok_column(table)``, without it. Raises :class:`StoreCorrupt` at
    the first row whose sum does not match (named by its first column) or whose text no longer decodes."""
    it = iter(rows)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except sqlite3.OperationalError as exc:  # "Could not decode to UTF-8 column ..."
            raise StoreCorrupt(table, "?", f"cannot be read ({exc})") from exc
        if row[-1] != 1:
            raise StoreCorrupt(table, row[0])
        yield row[:-1]


def checked_one(table: str, row: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """``checked`` for a ``fetchone()`` result (``None`` stays ``None``)."""
    return None if row is None else next(checked(table, [row]))


def _triggers(table: str) -> str:
    columns = ", ".join(name for name, _ in TABLES[table])
    body = f"UPDATE {table} SET rowsum = {_sum_expr(table, 'NEW.')} WHERE rowid = NEW.rowid;"
    return (
        f"CREATE TRIGGER IF NOT EXISTS {table}_rowsum_insert AFTER INSERT ON {table} BEGIN {body} END;\n"
        f"CREATE TRIGGER IF NOT EXISTS {table}_rowsum_update AFTER UPDATE OF {columns} ON {table} BEGIN {body} END;\n"
    )


def ensure(conn: sqlite3.Connection) -> int:
    """Give every table its ``rowsum`` column and triggers; a store written before checksums has its rows summed as
    found (in one transaction, logged). The number of rows summed that way (0 on a new or an up-to-date store)."""
    install(conn)
    missing = [t for t in TABLES if "rowsum" not in {row[1] for row in conn.execute(f"PRAGMA table_info({t})")}]
    if not missing:
        conn.executescript("".join(_triggers(t) for t in TABLES))
        return 0
    summed = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in missing:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN rowsum INTEGER")
            summed += conn.execute(f"UPDATE {table} SET rowsum = {_sum_expr(table)}").rowcount
        for table in TABLES:
            for statement in _triggers(table).splitlines():
                conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if summed:
        log.warning(
            "store written before row checksums: %d rows summed as found, checked at every open from now on", summed
        )
    return summed


def verify(conn: sqlite3.Connection) -> None:
    """Check every row of every table. Raises :class:`StoreCorrupt` for the first that does not match."""
    for table, columns in TABLES.items():
        first = columns[0][0]
        try:
            row = conn.execute(
                f"SELECT CAST({first} AS BLOB), rowid FROM {table} WHERE NOT {ok_column(table)} LIMIT 1"
            ).fetchone()
        except sqlite3.OperationalError as exc:
            raise StoreCorrupt(table, "?", f"cannot be read ({exc})") from exc
        if row is not None:
            name = row[0].decode("utf-8", "replace") if isinstance(row[0], bytes) else row[0]
            raise StoreCorrupt(table, name if name not in (None, "") else f"rowid {row[1]}")
