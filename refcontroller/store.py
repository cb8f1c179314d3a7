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
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Collection, Iterator
from pathlib import Path

import attrs

from provisionerd.domain.model import CommittedFact, DemandSnapshot, Epoch, Fact, InstanceFact, RequestIntent
from refcontroller.jsonconv import demand_items_from_json, demand_items_to_json, fact_from_json, fact_to_json

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

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(cls, path: str | Path) -> FactStore:
        conn = sqlite3.connect(str(path), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(_SCHEMA)
        return cls(conn)

    def close(self) -> None:
        self._conn.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    # --- the HA term ------------------------------------------------------------------------------------------

    def load_term(self) -> int:
        """The last term saved (0 on a new store)."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'term'").fetchone()
        return int(row[0]) if row else 0

    def save_term(self, term: int) -> None:
        """Persist ``term`` durably. Refuses to go backwards: the term is a fencing token."""
        with self._transaction():
            current = self.load_term()
            if term <= current:
                raise ValueError(f"term must grow: stored {current}, asked to save {term}")
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('term', ?)", (str(term),))

    # --- demand -----------------------------------------------------------------------------------------------

    def load_demand(self) -> DemandSnapshot:
        seq = self._conn.execute("SELECT value FROM meta WHERE key = 'demand_seq'").fetchone()
        items = self._conn.execute("SELECT value FROM meta WHERE key = 'demand_items'").fetchone()
        if seq is None or items is None:
            return DemandSnapshot(seq=0, items=())
        return DemandSnapshot(seq=int(seq[0]), items=demand_items_from_json(items[0]))

    def save_demand(self, snapshot: DemandSnapshot) -> None:
        with self._transaction():
            self._conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [("demand_seq", str(snapshot.seq)), ("demand_items", demand_items_to_json(snapshot.items))],
            )

    # --- lease grantees ---------------------------------------------------------------------------------------

    def last_grantee(self, provider: str) -> str | None:
        """The holder ``provider``'s lease was last newly granted to (``None`` if never)."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (f"grantee:{provider}",)).fetchone()
        return row[0] if row else None

    def save_grantee(self, provider: str, holder: str) -> None:
        """Record durably that ``provider``'s lease is granted to ``holder`` (before the grant is answered)."""
        with self._transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (f"grantee:{provider}", holder)
            )

    # --- the fact log -----------------------------------------------------------------------------------------

    def find(self, fact: Fact) -> CommittedFact | None:
        """The committed copy of an equal fact, if there is one (a retried commit whose ack was lost)."""
        row = self._conn.execute("SELECT idx FROM facts WHERE digest = ?", (_digest(fact_to_json(fact)),)).fetchone()
        return CommittedFact(index=row[0], fact=fact) if row else None

    def append(self, fact: Fact, holder: str) -> CommittedFact:
        """Append ``fact`` (committed by lease holder ``holder``) and index its join-token hashes, atomically.

        The caller has checked the epoch rules; the store only refuses a byte-identical duplicate (``ValueError``).
        """
        body = fact_to_json(fact)
        with self._transaction():
            try:
                cursor = self._conn.execute(
                    "INSERT INTO facts (provider, epoch_term, epoch_seq, holder, digest, body)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (fact.provider, fact.epoch.term, fact.epoch.seq, holder, _digest(body), body),
                )
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"fact already committed: {body[:200]}") from exc
            index = cursor.lastrowid
            assert index is not None
            self._index_tokens(fact)
        return CommittedFact(index=index, fact=fact)

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

    def latest(self, provider: str) -> LatestFact | None:
        """Epoch and holder on ``provider``'s latest committed fact (highest index), or ``None``."""
        row = self._conn.execute(
            "SELECT epoch_term, epoch_seq, holder FROM facts WHERE provider = ? ORDER BY idx DESC LIMIT 1",
            (provider,),
        ).fetchone()
        return LatestFact(Epoch(row[0], row[1]), row[2]) if row else None

    def latest_epochs(self) -> dict[str, Epoch]:
        """Every provider's epoch on its latest committed fact."""
        rows = self._conn.execute(
            "SELECT provider, epoch_term, epoch_seq FROM facts f WHERE idx ="
            " (SELECT max(idx) FROM facts g WHERE g.provider = f.provider)"
        )
        return {provider: Epoch(term, seq) for provider, term, seq in rows}

    def fact_sizes(self, providers: Collection[str], upto_index: int) -> list[tuple[int, int]]:
        """``(index, JSON size)`` of each fact of ``providers`` up to ``upto_index``, in log order (for paging)."""
        marks = ",".join("?" * len(providers))
        return [
            (int(i), int(n))
            for i, n in self._conn.execute(
                f"SELECT idx, length(body) FROM facts WHERE provider IN ({marks}) AND idx <= ? ORDER BY idx",
                (*providers, upto_index),
            )
        ]

    def facts(self, providers: Collection[str], first_index: int, last_index: int) -> list[CommittedFact]:
        """Facts of ``providers`` with ``first_index <= index <= last_index``, in log order."""
        marks = ",".join("?" * len(providers))
        rows = self._conn.execute(
            f"SELECT idx, body FROM facts WHERE provider IN ({marks}) AND idx BETWEEN ? AND ? ORDER BY idx",
            (*providers, first_index, last_index),
        )
        return [CommittedFact(index=int(i), fact=fact_from_json(body)) for i, body in rows]

    def all_facts(self) -> Iterator[CommittedFact]:
        for i, body in self._conn.execute("SELECT idx, body FROM facts ORDER BY idx"):
            yield CommittedFact(index=int(i), fact=fact_from_json(body))

    # --- join tokens ------------------------------------------------------------------------------------------

    def token_claims(self, token_hash: str) -> list[TokenClaim]:
        rows = self._conn.execute(
            "SELECT instance_ref, provider, machine_id, hostname, address FROM token_claims WHERE token_hash = ?",
            (token_hash,),
        )
        return [TokenClaim(*row) for row in rows]

    def use_token(self, token_hash: str, instance_ref: str, at: float, rejoin_hash: str = "") -> bool:
        """Mark the token used; ``False`` if it already was (the check and the mark are one statement).

        ``rejoin_hash`` (``agent.token.rejoin_hash``) is stored with it, in the same transaction.
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
        return cursor.rowcount == 1

    def rejoin_token_hash(self, instance_ref: str, rejoin_hash: str) -> str | None:
        """The token hash the instance was admitted with, if ``rejoin_hash`` is the one stored for it."""
        row = self._conn.execute(
            "SELECT token_hash FROM rejoin_hashes WHERE instance_ref = ? AND rejoin_hash = ?",
            (instance_ref, rejoin_hash),
        ).fetchone()
        return None if row is None else str(row[0])


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or ``ROLLBACK`` on error); nested use joins the outer transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._outer = False

    def __enter__(self) -> None:
        self._outer = not self._conn.in_transaction
        if self._outer:
            self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()
