"""The per-instance worker credentials in the store: one row per instance, the SHA-256 of its secret only.

A worker's first join spends its single-use token (``used_tokens``) and, in the same transaction, records the hash
of the credential the controller gives it (``refcontroller.credentials``). Every later join of that instance
presents the credential; the row says whether it still admits:

- ``revoked`` is ``''`` while it does; ``'lost'`` once the controller gave the host up (one heartbeat timeout
  after its connection ended). Revocation is a write like any other: it survives a restart and a failover.
- ``delivered_at`` is 0 until the worker sent a frame after the reply that carried the credential: until then the
  credential may never have reached it (the controller died, or the connection broke, between the commit and the
  reply: issue 31, a healthy machine returned because its token was spent and its credential lost). While it is 0,
  no session of the instance is live and nothing revoked it, the token (or the address-bound claim) it was
  exchanged for may be presented again: ``reissue_undelivered`` replaces it with a new credential.
- A machine that is *gone* (a ``Returned`` names it or a ``Lost`` is about it, ``store_lifecycle``'s
  ``lifecycle_machines.gone``) is refused whatever the row says: that part is derived from the fact log itself,
  so no commit has to remember to revoke anything.

These functions run inside the caller's ``Transaction`` (``FactStore`` wraps each one); they never see a secret,
only its hash.
"""

from __future__ import annotations

import sqlite3

import attrs

from refcontroller import store_rows

SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_credentials (
    instance_ref TEXT PRIMARY KEY,
    credential_hash TEXT NOT NULL,
    issued_at REAL NOT NULL,
    revoked TEXT NOT NULL DEFAULT '',
    revoked_at REAL NOT NULL DEFAULT 0,
    delivered_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS token_claims_by_instance ON token_claims (instance_ref);
CREATE INDEX IF NOT EXISTS token_claims_by_machine ON token_claims (machine_id);
"""


@attrs.frozen
class CredentialRecord:
    """What the store knows of one instance's credential (``revoked``: ``''`` while it admits)."""

    instance_ref: str
    credential_hash: str = attrs.field(repr=False)
    issued_at: float
    revoked: str = ""
    revoked_at: float = 0.0
    delivered_at: float = 0.0  # 0: the worker may never have received it


#: The column added to a store written before ``delivered_at`` existed (its credentials count as delivered).
DELIVERED_COLUMN = ("delivered_at", "REAL NOT NULL DEFAULT 0")


def add_delivered(conn: sqlite3.Connection) -> None:
    """Bring a store written before ``delivered_at`` up to date: every credential it holds counts as delivered (the
    safe side: none may be taken again by its token)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(worker_credentials)")}
    if DELIVERED_COLUMN[0] in columns:
        return
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"ALTER TABLE worker_credentials ADD COLUMN {DELIVERED_COLUMN[0]} {DELIVERED_COLUMN[1]}")
    conn.execute("UPDATE worker_credentials SET delivered_at = issued_at")
    conn.execute("COMMIT")


def issue(conn: sqlite3.Connection, instance_ref: str, credential_hash: str, at: float) -> None:
    """Record ``credential_hash`` as ``instance_ref``'s only credential (a previous one stops admitting)."""
    conn.execute(
        "INSERT OR REPLACE INTO worker_credentials (instance_ref, credential_hash, issued_at) VALUES (?, ?, ?)",
        (instance_ref, credential_hash, at),
    )


def record(conn: sqlite3.Connection, instance_ref: str) -> CredentialRecord | None:
    row = store_rows.checked_one(
        "worker_credentials",
        conn.execute(
            "SELECT instance_ref, credential_hash, issued_at, revoked, revoked_at, delivered_at, "
            + store_rows.ok_column("worker_credentials")
            + " FROM worker_credentials WHERE instance_ref = ?",
            (instance_ref,),
        ).fetchone(),
    )
    if row is None:
        return None
    return CredentialRecord(str(row[0]), str(row[1]), float(row[2]), str(row[3]), row[4], float(row[5]))


def mark_delivered(conn: sqlite3.Connection, instance_ref: str, at: float) -> bool:
    """The worker sent a frame after the reply carrying its credential: it has it. ``True`` if this changed."""
    cursor = conn.execute(
        "UPDATE worker_credentials SET delivered_at = ? WHERE instance_ref = ? AND delivered_at = 0",
        (at, instance_ref),
    )
    return cursor.rowcount == 1


def reissue_undelivered(
    conn: sqlite3.Connection, token_hash: str, instance_ref: str, credential_hash: str, at: float
) -> bool:
    """Replace ``instance_ref``'s credential with ``credential_hash`` if the token ``token_hash`` was spent by that
    very instance, and its credential was never delivered nor revoked (module docstring). Whether it did."""
    used = store_rows.checked_one(
        "used_tokens",
        conn.execute(
            f"SELECT instance_ref, {store_rows.ok_column('used_tokens')} FROM used_tokens WHERE token_hash = ?",
            (token_hash,),
        ).fetchone(),
    )
    if used is None or str(used[0]) != instance_ref:
        return False
    cursor = conn.execute(
        "UPDATE worker_credentials SET credential_hash = ?, issued_at = ? WHERE instance_ref = ? AND delivered_at = 0"
        " AND revoked = ''",
        (credential_hash, at, instance_ref),
    )
    return cursor.rowcount == 1


def revoke(conn: sqlite3.Connection, instance_ref: str, reason: str, at: float) -> bool:
    """Mark the credential revoked (the first reason stays); ``True`` if it admitted until now."""
    cursor = conn.execute(
        "UPDATE worker_credentials SET revoked = ?, revoked_at = ? WHERE instance_ref = ? AND revoked = ''",
        (reason, at, instance_ref),
    )
    return cursor.rowcount == 1


def take_rejoin_hash(conn: sqlite3.Connection, instance_ref: str, rejoin_hash: str) -> str | None:
    """The token hash a rejoin proof stands for, deleting the proof's row (it is exchanged once); ``None`` when the
    proof is not the one stored for ``instance_ref``."""
    row = store_rows.checked_one(
        "rejoin_hashes",
        conn.execute(
            f"SELECT instance_ref, token_hash, {store_rows.ok_column('rejoin_hashes')} FROM rejoin_hashes"
            " WHERE instance_ref = ? AND rejoin_hash = ?",
            (instance_ref, rejoin_hash),
        ).fetchone(),
    )
    if row is None:
        return None
    conn.execute("DELETE FROM rejoin_hashes WHERE instance_ref = ?", (instance_ref,))
    return str(row[1])


def instance_gone(conn: sqlite3.Connection, instance_ref: str) -> bool:
    """Whether the fact log says the machine of ``instance_ref`` was returned or lost."""
    row = conn.execute(
        "SELECT 1 FROM lifecycle_machines WHERE instance_ref = ? AND gone = 1 LIMIT 1", (instance_ref,)
    ).fetchone()
    return row is not None


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """``{"live": n, "<reason>": n, ...}`` over every credential issued (for the controller's status)."""
    found = {"live": 0}
    for reason, n in conn.execute("SELECT revoked, count(*) FROM worker_credentials GROUP BY revoked"):
        found[reason or "live"] = int(n)
    return found
