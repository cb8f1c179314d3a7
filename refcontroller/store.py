"""The controller's durable state in one SQLite file: the fact log, the HA term, the demand, join tokens, and
who was last granted each provider's lease.

What is durable and what is not follows the lease design (seed Q3): the facts (each stamped with its lease epoch
and the holder that committed it), the HA term and the set of used join tokens survive a restart; the lease table
does not (it lives in the primary's memory, see ``leases.py``), but each provider's last *grantee* does: after a
failover only that holder can still believe in a lease, so the grace re-grants to it alone (the writer of the
latest fact is not enough: a holder may be granted and lose the primary before it commits anything). A holder is a
daemon process (``leases.holder_key``: identity and instance), so after a failover another start of the same
identity waits out the grace too. The demand snapshot is stored too, so that its ``seq`` keeps growing across a
restart and a daemon never ignores the first snapshot after one.

Every write is one SQLite transaction with ``synchronous=FULL``: when a method returns, the change is on disk.
The store is synchronous on purpose: the reference controller calls it from the event loop so a run on trio's
``MockClock`` stays deterministic (a commit costs one fsync, which is fine for a reference implementation).

Fact indexes are SQLite ``AUTOINCREMENT`` row ids: strictly increasing, never reused, starting at 1.

**Commit times.** When the controller committed each fact (wall-clock epoch seconds, ``CommittedFact.committed_at``)
is in a table of its own, ``fact_times (idx, at)``, written in the fact's transaction and read with the fact by a
``LEFT JOIN`` on the primary key. Not a column of ``facts``: every row carries a checksum of its columns
(``store_rows``), so a new column there would change the sum of every row already written. ``fact_times`` rows carry
their own sum (checked at every open and at every read, as the facts' are). A fact with no row (committed by a
controller from before the table, or with no wall clock given) reads 0, "not known"; a store from before the table
gains it, empty, when it is opened. The log is never pruned (ended lifecycles stay for audit), so the table holds at
most one row per fact.

**Incarnation and mark.** A store is one *incarnation* of the controller's memory: a random id made when the store
is created, and never again (it is in the ``meta`` table and in every ``JoinReply``, so a daemon can tell a
controller that forgot what it acknowledged from one that did not). Beside the SQLite file, ``<file>.mark`` records
the incarnation and how far the store had come (a counter of committed write transactions, the term and the last
fact index), rewritten atomically after every write transaction. Opening checks the two against each other and
refuses, with :class:`StoreRefused` (one line), a store that cannot be the one its mark describes:

- a zero-length file (a store that never had its first page written is not one we made: creation writes the mark
  first, then the file);
- a mark without its file (the directory kept its term record, the log is gone);
- a file that SQLite cannot read, or whose ``quick_check`` fails (damaged); one that cannot be opened because its
  file system is full is reported full, not damaged (``store_full``);
- a row that fails its checksum (``store_rows``: every row of every table carries a CRC-32 of its columns, written
  with it by a trigger; every open checks them all, and the reads of facts, meta, credentials and token claims
  check theirs at run time, raising ``store_rows.StoreCorrupt``, a ``StoreFailure``, answered ``storage_failure``);
- a file without an incarnation while a mark names one, or with another incarnation than the mark's;
- a file whose write counter is below the mark's. This is what a lost write-ahead log leaves behind: a store in
  WAL mode keeps every transaction since the last checkpoint in ``<file>-wal`` only, so after a ``kill -9`` and the
  loss of that file the main file is the bare 4096-byte header page (no tables: it opens as an empty store) or the
  state of the last checkpoint; restoring an older copy looks the same.

**Storage failures.** A write SQLite cannot make durable (``database or disk is full``, an I/O error, a database
that went read-only) raises :class:`StoreFailure` after the transaction was rolled back: the store is exactly as
it was before the call, and the caller (``cluster.Cluster``) answers ``Rejected{storageFailure}`` and keeps the
link; nothing it holds in memory advances. A failure to rewrite the mark *after* a commit is only logged: the
commit is durable, and a mark behind its store is what a crash between the two leaves too (it is not refused).

**Test-only page limit.** When ``REFCONTROLLER_TEST_PAGE_LIMIT_FILE`` names a file, each write transaction first
reads it: a number there is applied as ``PRAGMA max_page_count`` (SQLite then really answers ``database or disk is
full`` once the file would grow past it), and a missing or empty file lifts the limit. This is how the real-process
tests fill the disk and free it again without root.

``FactStore.open(path, new_incarnation=True)`` is the explicit way to start afresh: whatever was there (file,
``-wal``, ``-shm``, mark) is renamed aside to ``<name>.discarded-<unix time>`` and a new incarnation is made. A
store written before incarnations existed (tables and rows, no incarnation, no mark) is given one, once, with a
warning. ``":memory:"`` stores (tests, the simulation) have an incarnation and no mark.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sqlite3
import stat
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from provisionerd.domain.model import CommittedFact, DemandSnapshot, Epoch, Fact, InstanceFact, RequestIntent
from provisionerd.telemetry.files import FILE_MODE, open_private
from refcontroller import store_credentials, store_full, store_lifecycle, store_rows
from refcontroller.jsonconv import (
    demand_items_from_json,
    demand_items_to_json,
    fact_from_json,
    fact_to_json,
    licenses_from_json,
    licenses_to_json,
)
from refcontroller.store_mark import (
    Mark,
    StoreRefused,
    mark_path,
    new_incarnation_id,
    read_mark,
    write_mark,
)
from refcontroller.store_tx import (  # StoreFailure and PAGE_LIMIT_ENV: this module's API too
    NO_PAGE_LIMIT,
    PAGE_LIMIT_ENV,
    StoreFailure,
    Transaction,
    page_limit_file,
)

log = logging.getLogger(__name__)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS facts (
    idx INTEGER PRIMARY KEY AUTOINCREMENT,
    provider TEXT NOT NULL,
    epoch_term INTEGER NOT NULL,
    epoch_seq INTEGER NOT NULL,
    holder TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS facts_by_provider ON facts (provider, idx);
CREATE TABLE IF NOT EXISTS fact_times (idx INTEGER PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS token_claims (
    token_hash TEXT NOT NULL,
    instance_ref TEXT NOT NULL,
    provider TEXT NOT NULL,
    machine_id TEXT NOT NULL DEFAULT '',
    hostname TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (token_hash, instance_ref)
);
CREATE TABLE IF NOT EXISTS used_tokens (
    token_hash TEXT PRIMARY KEY,
    instance_ref TEXT NOT NULL,
    used_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rejoin_hashes (
    instance_ref TEXT PRIMARY KEY,
    rejoin_hash TEXT NOT NULL,
    token_hash TEXT NOT NULL
);
"""


@attrs.frozen
class HistoryRow:
    """A fact of the audit log as ``FactStore.history`` reads it."""

    index: int
    #: 0 while the fact is live, else the index of the fact that ended its lifecycle (``store_lifecycle``).
    ended_at: int
    fact: Fact
    #: Wall-clock epoch seconds when the controller committed it; 0 when not known.
    committed_at: float


@attrs.frozen
class LatestFact:
    """The epoch on a provider's latest committed fact and the holder that wrote it (``leases.holder_key``)."""

    epoch: Epoch
    holder: str


@attrs.frozen
class TokenClaim:
    """A committed fact says the worker presenting this token hash is ``instance_ref`` of ``provider``.

    ``machine_id``/``hostname``/``address`` are empty while only the request intent is known.
    """

    instance_ref: str
    provider: str
    machine_id: str = ""
    hostname: str = ""
    address: str = ""


class FactStore:
    """The SQLite file. Open with :meth:`open` (a path, or ``":memory:"`` for tests) and :meth:`close` it."""

    def __init__(self, conn: sqlite3.Connection, incarnation: str, mark: Path | None = None) -> None:
        self._conn = conn
        #: This store's incarnation id (made when it was created, never again).
        self.incarnation = incarnation
        self._mark = mark
        #: The instance refs whose lifecycle the last ``append`` ended (``store_lifecycle``): their hosts go.
        self.ended_refs: tuple[str, ...] = ()

    @classmethod
    def open(cls, path: str | Path, *, new_incarnation: bool = False, incarnation: str | None = None) -> FactStore:
        """Open (or create) the store at ``path`` after checking it against its mark (see the module docstring).

        ``new_incarnation``: set aside whatever is there and start a new incarnation. ``incarnation``: the id a
        new store gets (default: ``new_incarnation_id()``; tests and the simulation name their own).

        Raises:
            StoreRefused: the store is damaged, lost, or behind its mark (one line, naming the path).
        """
        fresh_id = incarnation or new_incarnation_id()
        if str(path) == ":memory:":
            conn = _connect(":memory:")
            _create_schema(conn)
            _create_meta(conn, fresh_id)
            return cls(conn, fresh_id)
        path = Path(path)
        marked = mark_path(path)
        if new_incarnation:
            _set_aside(path, marked)
        mark = read_mark(marked)
        if mark is None and not path.exists():  # a new store: the mark first, so a lost file is always noticed
            mark = Mark(fresh_id, 0, 0, 0)
            try:
                write_mark(marked, mark)
            except OSError as exc:
                raise StoreRefused(store_full.describe_open_failure(path, exc)) from None
        created = mark is not None and mark.changes == 0  # nothing was ever written under this mark
        if path.exists() and path.stat().st_size == 0 and not created:
            raise StoreRefused(
                f"store {str(path)!r} is a zero-length file"
                + (
                    f" but its mark says {mark.describe()}"
                    if mark is not None
                    else " (not a store this controller made)"
                )
                + ": refusing to start as a new controller (--new-incarnation starts afresh on purpose)"
            )
        if not path.exists() and mark is not None and not created:
            raise StoreRefused(
                f"store {str(path)!r} is missing but its mark says {mark.describe()}: refusing to start as a new"
                " controller (--new-incarnation starts afresh on purpose)"
            )
        _make_private(path)
        try:
            conn = _connect(path)
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
            had_tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'meta'").fetchone()[0] > 0
            _create_schema(conn)
            store_rows.verify(conn)
            stored = _meta(conn, "incarnation")
            has_rows = had_tables and any(
                conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() for table in ("facts", "meta", "used_tokens")
            )
        except store_rows.StoreCorrupt as exc:
            conn.close()
            raise StoreRefused(
                f"store {str(path)!r} is damaged: {exc} (restore a good copy; --new-incarnation starts afresh on"
                " purpose)"
            ) from None
        except sqlite3.DatabaseError as exc:
            raise StoreRefused(store_full.describe_open_failure(path, exc)) from None
        store = cls(conn, stored or "", marked)
        try:
            store._check_against(path, mark, stored, has_rows, fresh_id)
        except BaseException:
            conn.close()
            raise
        return store

    def _check_against(self, path: Path, mark: Mark | None, stored: str | None, has_rows: bool, fresh_id: str) -> None:
        conn = self._conn
        if stored is None:
            if mark is not None and mark.changes > 0:
                raise StoreRefused(
                    f"store {str(path)!r} holds no incarnation but its mark says {mark.describe()}: its write-ahead"
                    " log was lost or the file was replaced (--new-incarnation starts afresh on purpose)"
                )
            if mark is None and has_rows:
                log.warning("store %s was written before incarnations: giving it one now", path)
            self.incarnation = mark.incarnation if mark is not None else fresh_id
            _create_meta(conn, self.incarnation)
            write_mark(mark_path(path), self._current_mark())
            return
        if mark is None:
            raise StoreRefused(
                f"store {str(path)!r} (incarnation {stored}) has lost its mark {str(mark_path(path))!r}: cannot tell"
                " whether its write-ahead log was lost (--new-incarnation starts afresh on purpose)"
            )
        if mark.incarnation != stored:
            raise StoreRefused(
                f"store {str(path)!r} is incarnation {stored} but its mark says {mark.describe()}: the file was"
                " replaced (--new-incarnation starts afresh on purpose)"
            )
        now = self._current_mark()
        if now.changes < mark.changes or now.last_index < mark.last_index or now.term < mark.term:
            raise StoreRefused(
                f"store {str(path)!r} is behind its mark: it holds change {now.changes}, term {now.term}, last index"
                f" {now.last_index}, the mark says {mark.describe()}: its write-ahead log was lost or an older copy"
                " was restored (--new-incarnation starts afresh on purpose)"
            )

    def _current_mark(self) -> Mark:
        return Mark(self.incarnation, int(_meta(self._conn, "changes") or 0), self.load_term(), self.last_index())

    def _after_commit(self) -> None:
        if self._mark is None:
            return
        try:
            write_mark(self._mark, self._current_mark())
        except (OSError, store_rows.StoreCorrupt) as exc:  # the commit is durable; a mark behind is not refused
            log.warning("store mark %s not rewritten after a commit: %s", self._mark, exc)

    def close(self) -> None:
        self._conn.close()

    def set_page_limit(self, pages: int | None) -> None:
        """A full disk on purpose (the simulation's ``storage_failure``, tests): SQLite refuses, with ``database or
        disk is full``, every write that needs more than ``pages`` pages (SQLite raises a limit below the current
        size to it: ``0`` means "not one page more"); ``None`` lifts the limit."""
        limit = NO_PAGE_LIMIT if pages is None else max(1, min(pages, NO_PAGE_LIMIT))
        self._conn.execute(f"PRAGMA max_page_count = {limit}")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction (``store_tx.Transaction``); after an outer commit, the mark is rewritten."""
        tx = Transaction(self._conn, page_limit_file())
        with tx:
            yield
        if tx.committed:
            self._after_commit()

    # --- the HA term ------------------------------------------------------------------------------------------

    def load_term(self) -> int:
        """The last term saved (0 on a new store)."""
        value = _meta(self._conn, "term")
        return int(value) if value is not None else 0

    def save_term(self, term: int) -> None:
        """Persist ``term`` durably. Refuses to go backwards: the term is a fencing token."""
        with self._transaction():
            current = self.load_term()
            if term <= current:
                raise ValueError(f"term must grow: stored {current}, asked to save {term}")
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('term', ?)", (str(term),))

    # --- demand -----------------------------------------------------------------------------------------------

    def load_demand(self) -> DemandSnapshot:
        seq, items = _meta(self._conn, "demand_seq"), _meta(self._conn, "demand_items")
        if seq is None or items is None:
            return DemandSnapshot(seq=0, items=())
        uses = _meta(self._conn, "demand_licenses")
        return DemandSnapshot(int(seq), demand_items_from_json(items), licenses_from_json(uses))

    def save_demand(self, snapshot: DemandSnapshot) -> None:
        with self._transaction():
            self._conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("demand_seq", str(snapshot.seq)),
                    ("demand_items", demand_items_to_json(snapshot.items)),
                    ("demand_licenses", licenses_to_json(snapshot.licenses)),
                ],
            )

    # --- lease grantees ---------------------------------------------------------------------------------------

    def last_grantee(self, provider: str) -> str | None:
        """The holder ``provider``'s lease was last newly granted to (``None`` if never)."""
        return _meta(self._conn, f"grantee:{provider}")

    def save_grantee(self, provider: str, holder: str) -> None:
        """Record durably that ``provider``'s lease is granted to ``holder`` (before the grant is answered)."""
        with self._transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (f"grantee:{provider}", holder)
            )

    # --- the fact log -----------------------------------------------------------------------------------------

    def find(self, fact: Fact) -> CommittedFact | None:
        """The committed copy of an equal fact, with its commit time, if there is one (a retried commit whose ack
        was lost)."""
        row = store_rows.checked_one(
            "fact_times",
            self._conn.execute(
                f"SELECT f.idx, {_AT}, {_TIME_OK} FROM facts f {_JOIN_TIMES} WHERE f.digest = ?",
                (_digest(fact_to_json(fact)),),
            ).fetchone(),
        )
        return CommittedFact(index=int(row[0]), fact=fact, committed_at=float(row[1])) if row else None

    def append(self, fact: Fact, holder: str, at: float = 0.0) -> CommittedFact:
        """Append ``fact`` (committed by lease holder ``holder`` at wall-clock time ``at``, epoch seconds; 0: not
        known, no time is stored) and index its join-token hashes, atomically.

        The caller has checked the epoch rules; the store only refuses a byte-identical duplicate (``ValueError``).
        """
        body = fact_to_json(fact)
        with self._transaction():
            index = self._insert(fact, body, holder, at)
            self._index_tokens(fact)
            ended = store_lifecycle.track(self._conn, fact, index)
        self.ended_refs = tuple(ended)
        return CommittedFact(index=index, fact=fact, committed_at=float(at) if 0 < at < math.inf else 0.0)

    def append_many(self, facts: Iterable[Fact], holder: str, at: float = 0.0) -> int:
        """Append ``facts`` in order in one transaction (a bulk load: benches, imports), each committed at ``at``
        (0: not known); the last index (0: none).

        The same rows as :meth:`append` one by one, without its per-fact transaction and mark rewrite. A
        duplicate raises ``ValueError`` and nothing is appended.
        """
        last = 0
        with self._transaction():
            for fact in facts:
                last = self._insert(fact, fact_to_json(fact), holder, at)
                self._index_tokens(fact)
                store_lifecycle.track(self._conn, fact, last)
        return last

    def _insert(self, fact: Fact, body: str, holder: str, at: float) -> int:
        """The fact's row and, when ``at`` is known (above 0), its time's, in the caller's transaction; its index."""
        try:
            cursor = self._conn.execute(
                "INSERT INTO facts (provider, epoch_term, epoch_seq, holder, digest, body) VALUES (?, ?, ?, ?, ?, ?)",
                (fact.provider, fact.epoch.term, fact.epoch.seq, holder, _digest(body), body),
            )
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"fact already committed: {body[:200]}") from exc
        index = cursor.lastrowid
        assert index is not None
        if 0 < at < math.inf:  # not known (0), or not a time (NaN, infinite): no row, read as 0
            self._conn.execute("INSERT INTO fact_times (idx, at) VALUES (?, ?)", (index, float(at)))
        return int(index)

    def _index_tokens(self, fact: Fact) -> None:
        if isinstance(fact, RequestIntent):
            self._conn.executemany(
                "INSERT OR IGNORE INTO token_claims (token_hash, instance_ref, provider) VALUES (?, ?, ?)",
                [(h, ref, fact.provider) for ref, h in zip(fact.instance_refs, fact.token_hashes, strict=True)],
            )
        elif isinstance(fact, InstanceFact):
            self._conn.execute(
                "INSERT INTO token_claims (token_hash, instance_ref, provider, machine_id, hostname, address)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (token_hash, instance_ref) DO UPDATE SET"
                " machine_id = excluded.machine_id, hostname = excluded.hostname, address = excluded.address",
                (fact.token_hash, fact.instance_ref, fact.provider, fact.machine_id, fact.hostname, fact.address),
            )

    def count(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM facts").fetchone()[0])

    def last_index(self) -> int:
        """The highest index ever committed (0 on an empty log)."""
        row = self._conn.execute("SELECT max(idx) FROM facts").fetchone()
        return int(row[0] or 0)

    def last_index_of(self, providers: Collection[str]) -> int:
        """The highest index of a fact of ``providers`` (0: none): the heartbeat digest's ``lastIndex``."""
        best = 0
        for provider in providers:
            row = self._conn.execute("SELECT max(idx) FROM facts WHERE provider = ?", (provider,)).fetchone()
            best = max(best, int(row[0] or 0))
        return best

    def latest(self, provider: str) -> LatestFact | None:
        """Epoch and holder on ``provider``'s latest committed fact (highest index), or ``None``."""
        row = store_rows.checked_one(
            "facts",
            self._conn.execute(
                f"SELECT idx, epoch_term, epoch_seq, holder, {_FACT_OK} FROM facts WHERE provider = ?"
                " ORDER BY idx DESC LIMIT 1",
                (provider,),
            ).fetchone(),
        )
        return LatestFact(Epoch(row[1], row[2]), row[3]) if row else None

    def latest_epochs(self) -> dict[str, Epoch]:
        """Every provider's epoch on its latest committed fact."""
        rows = self._conn.execute(
            f"SELECT idx, provider, epoch_term, epoch_seq, {_FACT_OK} FROM facts f WHERE idx ="
            " (SELECT max(idx) FROM facts g WHERE g.provider = f.provider)"
        )
        return {provider: Epoch(term, seq) for _, provider, term, seq in store_rows.checked("facts", rows)}

    def fact_sizes(self, providers: Collection[str], upto_index: int) -> list[tuple[int, int]]:
        """``(index, JSON size)`` of each fact of ``providers`` in the resync set as of ``upto_index`` (the live
        ones, ``store_lifecycle``, and each provider's latest), in log order (for paging)."""
        sizes = self._resync_rows(providers, 1, upto_index, upto_index, "length(f.body)", times=False)
        return [(i, int(n)) for i, n, _ in sizes]

    def facts(
        self, providers: Collection[str], first_index: int, last_index: int, as_of: int | None = None
    ) -> list[CommittedFact]:
        """Facts of ``providers`` with ``first_index <= index <= last_index``, in log order: every one, or (with
        ``as_of``) those of the resync set as of that index (``fact_sizes``)."""
        return [
            CommittedFact(index=i, fact=fact_from_json(body), committed_at=at)
            for i, body, at in self.fact_bodies(providers, first_index, last_index, as_of)
        ]

    def fact_bodies(
        self, providers: Collection[str], first_index: int, last_index: int, as_of: int | None = None
    ) -> list[tuple[int, str, float]]:
        """``facts`` as ``(index, JSON text, commit time)``, undecoded: one ordered index scan (each row's time by
        its primary key); a caller decodes them in steps (``cluster.Cluster.resync_facts_in_steps``)."""
        if as_of is not None:
            live = self._resync_rows(providers, first_index, last_index, as_of, "f.body")
            return [(i, str(body), at) for i, body, at in live]
        marks = ",".join("?" * len(providers))
        rows = self._conn.execute(
            f"SELECT f.idx, f.body, {_AT}, {_FACT_OK_F}, {_TIME_OK} FROM facts f {_JOIN_TIMES}"
            f" WHERE f.provider IN ({marks}) AND f.idx BETWEEN ? AND ? ORDER BY f.idx",
            (*providers, first_index, last_index),
        )
        return [(int(i), str(body), float(at)) for i, body, at in _checked_with_times(rows)]

    def facts_after(self, providers: Collection[str], after: int, upto: int) -> list[tuple[int, int]]:
        """``(index, JSON size)`` of every fact of ``providers`` (live or ended) with ``after < index <= upto``."""
        marks = ",".join("?" * len(providers))
        return [
            (int(i), int(n))
            for i, n in self._conn.execute(
                f"SELECT idx, length(body) FROM facts WHERE provider IN ({marks}) AND idx > ? AND idx <= ?"
                " ORDER BY idx",
                (*providers, after, upto),
            )
        ]

    def resync_sizes(
        self, providers: Collection[str], after: int, as_of: int, limit: int, *, every: bool = False
    ) -> list[tuple[int, int]]:
        """``(index, JSON size)`` of the first ``limit`` facts of ``providers`` with ``after < index <= as_of`` in
        the resync set as of ``as_of`` (``fact_sizes``), or, with ``every``, of all of them (``facts_after``), in log
        order: one bounded chunk of a resync plan (``cluster.ResyncPlanner``), each query an ordered index scan.

        Calls with the same ``as_of`` chained by ``after`` (the last index of the previous chunk) give exactly
        ``fact_sizes`` (or ``facts_after``) whatever is committed between them: a fact with an index up to
        ``as_of`` that ends later ends at a later index, so it stays in the set as of ``as_of``."""
        rows: dict[int, int] = {}
        queries: list[tuple[str, tuple[str | int, ...]]]
        for provider in providers:
            if every:
                queries = [
                    (
                        "SELECT idx, length(body) FROM facts WHERE provider = ? AND idx > ? AND idx <= ? ORDER BY idx"
                        " LIMIT ?",
                        (provider, after, as_of, limit),
                    ),
                ]
            else:
                queries = [
                    (
                        "SELECT idx, length(body) FROM facts WHERE provider = ? AND ended_at = 0 AND idx > ?"
                        " AND idx <= ? ORDER BY idx LIMIT ?",
                        (provider, after, as_of, limit),
                    ),
                    (
                        # the facts ended since as_of (few): by ended_at, not by scanning idx past every ended one
                        "SELECT idx, length(body) FROM facts INDEXED BY facts_live WHERE provider = ? AND ended_at > ?"
                        " AND idx > ? AND idx <= ? ORDER BY idx LIMIT ?",
                        (provider, as_of, after, as_of, limit),
                    ),
                    (
                        "SELECT idx, length(body) FROM facts WHERE provider = ? AND idx <= ? ORDER BY idx DESC LIMIT 1",
                        (provider, as_of),
                    ),
                ]
            for query, args in queries:
                for i, n in self._conn.execute(query, args):
                    if int(i) > after:
                        rows[int(i)] = int(n)
        return sorted(rows.items())[:limit]

    def _resync_rows(
        self, providers: Collection[str], first: int, last: int, as_of: int, column: str, *, times: bool = True
    ) -> list[tuple[int, Any, float]]:
        """``(idx, column, commit time)`` of the facts live as of ``as_of`` with ``first <= idx <= last``, plus each
        provider's latest fact up to ``as_of`` (so the daemon's latest epoch and last index are what the whole log
        says). ``column`` names the facts table ``f``; without ``times`` the time is not read (0)."""
        rows: dict[int, tuple[Any, float]] = {}
        last = min(last, as_of)
        picked = f"f.idx, {column}, {_AT if times else '0.0'}, {_FACT_OK_F}, {_TIME_OK if times else '1'}"
        join = _JOIN_TIMES if times else ""
        for provider in providers:
            for i, value, at in _checked_with_times(
                self._conn.execute(
                    f"SELECT {picked} FROM facts f {join} WHERE f.provider = ? AND f.ended_at = 0"
                    f" AND f.idx BETWEEN ? AND ? UNION ALL SELECT {picked} FROM facts f INDEXED BY facts_live {join}"
                    " WHERE f.provider = ? AND f.ended_at > ? AND f.idx BETWEEN ? AND ?",
                    (provider, first, last, provider, as_of, first, last),
                ),
            ):
                rows[int(i)] = (value, float(at))
            for i, value, at in _checked_with_times(
                self._conn.execute(
                    f"SELECT {picked} FROM facts f {join} WHERE f.provider = ? AND f.idx <= ?"
                    " ORDER BY f.idx DESC LIMIT 1",
                    (provider, as_of),
                ).fetchall()
            ):
                if first <= i <= last:
                    rows[int(i)] = (value, float(at))
        return [(i, value, at) for i, (value, at) in sorted(rows.items())]

    def history(self, provider: str, after: int = 0, limit: int = 500) -> list[HistoryRow]:
        """``provider``'s facts after index ``after``, at most ``limit`` (a page of the audit log: live facts have
        ``ended_at`` 0; a fact whose commit time is not known has ``committed_at`` 0)."""
        rows = self._conn.execute(
            f"SELECT f.idx, f.ended_at, f.body, {_AT}, {_FACT_OK_F}, {_TIME_OK} FROM facts f {_JOIN_TIMES}"
            " WHERE f.provider = ? AND f.idx > ? ORDER BY f.idx LIMIT ?",
            (provider, after, max(1, min(limit, 10_000))),
        )
        return [
            HistoryRow(int(i), int(e), fact_from_json(body), float(at)) for i, e, body, at in _checked_with_times(rows)
        ]

    def history_rows(
        self, providers: Collection[str] | None, after: int, until: int, limit: int
    ) -> list[tuple[int, str, float]]:
        """``(index, JSON body, commit time)`` of the first ``limit`` facts of ``providers`` (``None``: every
        provider) with ``after < index <= until``, ended lifecycles included, in log order: a page of the history
        query (``refcontroller.history``). Each query is an ordered index scan stopped by its ``LIMIT`` (the primary
        key, or ``facts_by_provider`` per provider, indexes only), then the bodies and times of the chosen rows by
        primary key: the work is bounded by ``limit`` (times the providers named), never by the log's length."""
        if limit < 1 or after >= until:
            return []
        chosen: list[int]
        if providers is None:
            chosen = [
                int(i)
                for (i,) in self._conn.execute(
                    "SELECT idx FROM facts WHERE idx > ? AND idx <= ? ORDER BY idx LIMIT ?", (after, until, limit)
                )
            ]
        else:
            found: set[int] = set()
            for provider in set(providers):
                found.update(
                    int(i)
                    for (i,) in self._conn.execute(
                        "SELECT idx FROM facts INDEXED BY facts_by_provider WHERE provider = ? AND idx > ?"
                        " AND idx <= ? ORDER BY idx LIMIT ?",
                        (provider, after, until, limit),
                    )
                )
            chosen = sorted(found)[:limit]
        if not chosen:
            return []
        marks = ",".join("?" * len(chosen))
        rows = self._conn.execute(
            f"SELECT f.idx, f.body, {_AT}, {_FACT_OK_F}, {_TIME_OK} FROM facts f {_JOIN_TIMES}"
            f" WHERE f.idx IN ({marks}) ORDER BY f.idx",
            chosen,
        )
        return [(int(i), str(body), float(at)) for i, body, at in _checked_with_times(rows)]

    def live_count(self, providers: Collection[str] | None = None) -> int:
        """How many facts are live (in the resync set, without the latest-fact extras)."""
        if providers is None:
            return int(self._conn.execute("SELECT count(*) FROM facts WHERE ended_at = 0").fetchone()[0])
        marks = ",".join("?" * len(providers))
        query = f"SELECT count(*) FROM facts WHERE ended_at = 0 AND provider IN ({marks})"
        return int(self._conn.execute(query, tuple(providers)).fetchone()[0])

    def instance_ended(self, instance_ref: str) -> bool:
        """Whether ``instance_ref`` is a machine whose lifecycle ended: it never joins again."""
        return store_lifecycle.ended_instance(self._conn, instance_ref)

    def draining(self, provider: str, machine_id: str) -> bool:
        """Whether a ``DrainRequested`` fact names the machine: its host takes no new work (``store_lifecycle``)."""
        return bool(machine_id) and store_lifecycle.draining(self._conn, provider, machine_id)

    def all_facts(self) -> Iterator[CommittedFact]:
        rows = self._conn.execute(
            f"SELECT f.idx, f.body, {_AT}, {_FACT_OK_F}, {_TIME_OK} FROM facts f {_JOIN_TIMES} ORDER BY f.idx"
        )
        for i, body, at in _checked_with_times(rows):
            yield CommittedFact(index=int(i), fact=fact_from_json(body), committed_at=float(at))

    # --- join tokens ------------------------------------------------------------------------------------------

    def token_claims(self, token_hash: str) -> list[TokenClaim]:
        rows = self._conn.execute(
            f"SELECT instance_ref, provider, machine_id, hostname, address, {_CLAIM_OK} FROM token_claims"
            " WHERE token_hash = ?",
            (token_hash,),
        )
        return [TokenClaim(*row) for row in store_rows.checked("token_claims", rows)]

    def instance_claims(self, instance_ref: str) -> list[TokenClaim]:
        """Every claim committed for ``instance_ref`` (whatever its token): who a credential's holder is."""
        rows = self._conn.execute(
            f"SELECT instance_ref, provider, machine_id, hostname, address, {_CLAIM_OK} FROM token_claims"
            " WHERE instance_ref = ?",
            (instance_ref,),
        )
        return [TokenClaim(*row) for row in store_rows.checked("token_claims", rows)]

    def machine_claims(self, machine_id: str) -> list[tuple[str, TokenClaim]]:
        """``(token hash, claim)`` of every instance fact that names ``machine_id`` (the address-bound join)."""
        rows = self._conn.execute(
            f"SELECT instance_ref, token_hash, provider, machine_id, hostname, address, {_CLAIM_OK} FROM token_claims"
            " WHERE machine_id = ? AND machine_id != '' LIMIT 10",
            (machine_id,),
        )
        return [(str(row[1]), TokenClaim(row[0], *row[2:])) for row in store_rows.checked("token_claims", rows)]

    def use_token(
        self, token_hash: str, instance_ref: str, at: float, rejoin_hash: str = "", credential_hash: str = ""
    ) -> bool:
        """Mark the token used; ``False`` if it already was (the check and the mark are one statement).

        ``rejoin_hash`` (``agent.token.rejoin_hash``; a controller before per-instance credentials) and
        ``credential_hash`` (the instance's new credential, ``store_credentials``) are stored with it, in the same
        transaction: a token is never spent without its credential being recorded.
        """
        with self._transaction():
            cursor = self._conn.execute(
                "INSERT OR IGNORE INTO used_tokens (token_hash, instance_ref, used_at) VALUES (?, ?, ?)",
                (token_hash, instance_ref, at),
            )
            if cursor.rowcount == 1 and rejoin_hash:
                self._conn.execute(
                    "INSERT OR REPLACE INTO rejoin_hashes (instance_ref, rejoin_hash, token_hash) VALUES (?, ?, ?)",
                    (instance_ref, rejoin_hash, token_hash),
                )
            if cursor.rowcount == 1 and credential_hash:
                store_credentials.issue(self._conn, instance_ref, credential_hash, at)
        return cursor.rowcount == 1

    def rejoin_token_hash(self, instance_ref: str, rejoin_hash: str) -> str | None:
        """The token hash the instance was admitted with, if ``rejoin_hash`` is the one stored for it."""
        row = store_rows.checked_one(
            "rejoin_hashes",
            self._conn.execute(
                "SELECT instance_ref, token_hash, "
                + store_rows.ok_column("rejoin_hashes")
                + " FROM rejoin_hashes WHERE instance_ref = ? AND rejoin_hash = ?",
                (instance_ref, rejoin_hash),
            ).fetchone(),
        )
        return None if row is None else str(row[1])

    # --- per-instance worker credentials (``store_credentials``) -----------------------------------------------

    def credential(self, instance_ref: str) -> store_credentials.CredentialRecord | None:
        """The credential record of ``instance_ref`` (``None``: none was ever issued)."""
        return store_credentials.record(self._conn, instance_ref)

    def exchange_rejoin_proof(self, instance_ref: str, rejoin_hash: str, credential_hash: str, at: float) -> bool:
        """A worker admitted before credentials existed trades its rejoin proof for a credential, once: only while
        the instance has no credential, and the proof's row is deleted in the same transaction."""
        with self._transaction():
            if store_credentials.record(self._conn, instance_ref) is not None:
                return False
            if store_credentials.take_rejoin_hash(self._conn, instance_ref, rejoin_hash) is None:
                return False
            store_credentials.issue(self._conn, instance_ref, credential_hash, at)
        return True

    def credential_delivered(self, instance_ref: str, at: float) -> bool:
        """The worker has its credential (it sent a frame after the reply carrying it); ``True`` if this changed."""
        with self._transaction():
            return store_credentials.mark_delivered(self._conn, instance_ref, at)

    def reissue_credential(self, token_hash: str, instance_ref: str, credential_hash: str, at: float) -> bool:
        """A spent token presented again by its own instance, whose credential was never delivered: a new credential
        replaces it (``store_credentials.reissue_undelivered``). Whether it did."""
        with self._transaction():
            return store_credentials.reissue_undelivered(self._conn, token_hash, instance_ref, credential_hash, at)

    def revoke_credential(self, instance_ref: str, reason: str, at: float) -> bool:
        """Revoke ``instance_ref``'s credential durably; ``True`` if it admitted until now."""
        with self._transaction():
            return store_credentials.revoke(self._conn, instance_ref, reason, at)

    def instance_gone(self, instance_ref: str) -> bool:
        """Whether the fact log says ``instance_ref``'s machine was returned or lost."""
        return store_credentials.instance_gone(self._conn, instance_ref)

    def credential_counts(self) -> dict[str, int]:
        return store_credentials.counts(self._conn)


def read_history(path: Path, provider: str, after: int = 0, limit: int = 500) -> list[HistoryRow]:
    """A page of ``provider``'s facts (``FactStore.history``) read from the store file at ``path`` without writing
    to it (SQLite read-only: safe beside a running controller). A store from before commit times (no
    ``fact_times`` table) reads every time as 0.

    Raises:
        StoreRefused: the file is missing, unreadable, damaged (a row of the page fails its checksum), or was
            written before lifecycles (serve on it once first).
    """
    if not path.is_file():
        raise StoreRefused(f"store {str(path)!r} does not exist")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreRefused(f"store {str(path)!r} cannot be read: {exc}") from None
    try:
        store_rows.install(conn)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fact_times'").fetchone() is None:
            # an empty stand-in in the connection's own temporary schema: the file is not written
            conn.execute("CREATE TEMP TABLE fact_times (idx INTEGER PRIMARY KEY, at REAL NOT NULL, rowsum INTEGER)")
        return FactStore(conn, "").history(provider, after, limit)
    except store_rows.StoreCorrupt as exc:
        raise StoreRefused(f"store {str(path)!r} is damaged: {exc}") from None
    except sqlite3.Error as exc:
        raise StoreRefused(
            f"store {str(path)!r} cannot be read ({exc}): serve on it once to bring it up to date"
        ) from None
    finally:
        conn.close()


def _make_private(path: Path) -> None:
    """The store file 0600 whatever the umask (created so, or narrowed): SQLite gives its ``-wal`` and ``-shm`` the
    database file's mode, and those it finds are narrowed too. The files hold hashes only, but the rule is the
    daemon's (``telemetry.files``): the controller's own files are private."""
    try:
        if not path.exists():
            os.close(open_private(path, os.O_WRONLY | os.O_CREAT))
        for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if name.exists() and stat.S_IMODE(name.stat().st_mode) != FILE_MODE:
                os.chmod(name, FILE_MODE)
    except OSError as exc:
        if store_full.is_full(path, exc):
            raise StoreRefused(store_full.describe_open_failure(path, exc)) from None
        raise StoreRefused(f"store {str(path)!r} cannot be made private: {exc.strerror or exc}") from None


def _connect(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    """The tables (``IF NOT EXISTS``); a log written before ``store_lifecycle`` gains its column and is replayed."""
    conn.executescript(_SCHEMA)
    conn.executescript(store_lifecycle.SCHEMA)
    conn.executescript(store_credentials.SCHEMA)
    store_credentials.add_delivered(conn)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(facts)")}
    missing = [(name, decl) for name, decl in store_lifecycle.FACT_COLUMNS if name not in columns]
    if missing:
        conn.execute("BEGIN IMMEDIATE")
        for name, decl in missing:
            conn.execute(f"ALTER TABLE facts ADD COLUMN {name} {decl}")
        replayed = store_lifecycle.backfill(conn)
        conn.execute("COMMIT")
        if replayed:
            log.warning("store written before lifecycles: %d facts replayed to tell live from ended", replayed)
    conn.executescript(store_lifecycle.FACT_INDEXES)
    store_rows.ensure(conn)


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    """A meta row's value, checked against its checksum (``store_rows.StoreCorrupt``)."""
    row = store_rows.checked_one(
        "meta", conn.execute(f"SELECT key, value, {_META_OK} FROM meta WHERE key = ?", (key,)).fetchone()
    )
    return None if row is None else str(row[1])


def _create_meta(conn: sqlite3.Connection, incarnation: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('incarnation', ?)", (incarnation,))
    conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('changes', '0')")
    conn.execute("COMMIT")


def _set_aside(path: Path, marked: Path) -> None:
    """Rename the store's files (if any) to ``<name>.discarded-<unix time>``: a new incarnation starts on purpose."""
    stamp = int(time.time())
    for victim in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"), marked):
        if victim.exists():
            aside = victim.with_name(f"{victim.name}.discarded-{stamp}")
            os.replace(victim, aside)
            log.warning("new incarnation: %s set aside as %s", victim, aside)


_FACT_OK = store_rows.ok_column("facts")
#: The facts table as ``f`` beside its commit times as ``t`` (``fact_times``, by primary key; no row: 0, not known).
_FACT_OK_F = store_rows.ok_column("facts", "f")
_JOIN_TIMES = "LEFT JOIN fact_times t ON t.idx = f.idx"
_AT = "COALESCE(t.at, 0.0)"
_TIME_OK = f"(t.idx IS NULL OR {store_rows.ok_column('fact_times', 't')})"
_META_OK = store_rows.ok_column("meta")
_CLAIM_OK = store_rows.ok_column("token_claims")


def _checked_with_times(rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """The rows of a query that ends with ``_FACT_OK_F, _TIME_OK`` (first column the index), without those two:
    ``store_rows.StoreCorrupt`` names the table whose row fails its checksum."""
    return store_rows.checked("facts", store_rows.checked("fact_times", rows))


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


__all__ = ["PAGE_LIMIT_ENV", "FactStore", "LatestFact", "StoreFailure", "StoreRefused", "TokenClaim"]
