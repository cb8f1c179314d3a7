"""The per-instance worker credentials in the store: one row per instance, the SHA-256 of its secret only.

A worker's first join spends its single-use token (``used_tokens``) and, in the same transaction, records the hash
of the credential the controller gives it (``refcontroller.credentials``). Every later join of that instance
presents the credential; the row says whether it still admits:

- ``revoked`` is ``''`` while it does; ``'lost'`` once the controller gave the host up (one heartbeat timeout
  after its connection ended). Revocation is a write like any other: it survives a restart and a failover.
- A machine that is *gone* (a ``Returned`` names it or a ``Lost`` is about it, ``store_lifecycle``'s
  ``lifecycle_machines.gone``) is refused whatever the row says: that part is derived from the fact log itself,
  so no commit has to remember to revoke anything.

These functions run inside the caller's ``Transaction`` (``FactStore`` wraps each one); they never see a secret,
only its hash.
"""

from __future__ import annotations

import sqlite3

import attrs

SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_credentials (
    instance_ref TEXT PRIMARY KEY,
    credential_hash TEXT NOT NULL,
    issued_at REAL NOT NULL,
    revoked TEXT NOT NULL DEFAULT '',
    revoked_at REAL NOT NULL DEFAULT 0
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


def issue(conn: sqlite3.Connection, instance_ref: str, credential_hash: str, at: float) -> None:
    """Record ``credential_hash`` as ``instance_ref``'s only credential (a previous one stops admitting)."""
    conn.execute(
        "INSERT OR REPLACE INTO worker_credentials (instance_ref, credential_hash, issued_at) VALUES (?, ?, ?)",
        (instance_ref, credential_hash, at),
    )


def record(conn: sqlite3.Connection, instance_ref: str) -> CredentialRecord | None:
    row = conn.execute(
        "SELECT instance_ref, credential_hash, issued_at, revoked, revoked_at FROM worker_credentials"
        " WHERE instance_ref = ?",
        (instance_ref,),
    ).fetchone()
    return None if row is None else CredentialRecord(str(row[0]), str(row[1]), float(row[2]), str(row[3]), row[4])


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
    row = conn.execute(
        "SELECT token_hash FROM rejoin_hashes WHERE instance_ref = ? AND rejoin_hash = ?", (instance_ref, rejoin_hash)
    ).fetchone()
    if row is None:
        return None
    conn.execute("DELETE FROM rejoin_hashes WHERE instance_ref = ?", (instance_ref,))
    return str(row[0])


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
