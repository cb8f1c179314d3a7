"""Which facts are still *live* (in the resync set) and which belong to a lifecycle that ended (history).

A resync sends a provider's live facts only (``docs/protocol.md`` §6.3, "History"); ended ones stay in the log for
audit (``FactStore.history``). Every fact carries ``ended_at``: 0 while it is live, else the index of the fact that
ended its lifecycle. The facts live *as of* log index ``L`` are those with ``idx <= L`` and ``ended_at`` 0 or above
``L``: a resync fixed at ``L`` sends exactly those, whatever is committed while its pages go out.

**Lifecycles**, from the fact kinds of ``provisionerd.domain.model``:

- a machine's *origin* is the op that brought it: the request op of its first ``InstanceFact``, or the op of its
  ``OrphanAdopted``. A machine is *gone* once a ``Returned`` names it or a ``Lost`` is about it.
- a request op (``RequestIntent``, its ``InstanceFact``\\ s, its ``RequestFailed``) is *closed* once it failed or
  reported as many machines as it asked for; an adoption op is closed at once. An origin op **ends** when it is
  closed and every machine it brought is gone (a failed intent with no machine ends with its ``RequestFailed``).
  With it end its facts and, for each of its machines, the ``Lost`` and ``OrphanReported`` facts about it.
- a return op (``ReturnIntent``, ``Returned``) ends when every machine it names has an origin that ended; so does
  a ``DrainRequested`` (``store.draining`` reads the live ones: the controller places no work on those hosts).
- an ``OrphanReported`` about a machine that has no origin stays live (an open finding), and so does anything
  else not covered above.

An ``InstanceFact`` or ``OrphanAdopted`` whose origin op already ended (a late machine) starts a lifecycle of its
own (its origin is the fact itself): the ended facts are not revived, and the daemon sees that machine without its
intent, as it sees an adopted one.

All of it is kept in the same transaction as the fact that changes it (``track``), in three tables beside the log;
``backfill`` replays a store written before them once, in log order. The ended lifecycles' instance refs are what
``track`` returns, so the controller drops their hosts.
"""

from __future__ import annotations

import sqlite3

from provisionerd.domain.model import (
    DrainRequested,
    Fact,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    RequestFailed,
    RequestIntent,
    Returned,
    ReturnIntent,
)
from refcontroller.jsonconv import fact_from_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS lifecycle_ops (
    provider TEXT NOT NULL,
    origin TEXT NOT NULL,
    wanted INTEGER NOT NULL DEFAULT 0,
    made INTEGER NOT NULL DEFAULT 0,
    closed INTEGER NOT NULL DEFAULT 0,
    ended_at INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, origin)
);
CREATE TABLE IF NOT EXISTS lifecycle_machines (
    provider TEXT NOT NULL,
    machine_id TEXT NOT NULL,
    origin TEXT NOT NULL,
    instance_ref TEXT NOT NULL DEFAULT '',
    gone INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, machine_id)
);
CREATE INDEX IF NOT EXISTS lifecycle_machines_by_origin ON lifecycle_machines (provider, origin);
CREATE INDEX IF NOT EXISTS lifecycle_machines_by_ref ON lifecycle_machines (instance_ref);
CREATE TABLE IF NOT EXISTS lifecycle_members (
    provider TEXT NOT NULL,
    origin TEXT NOT NULL,
    idx INTEGER NOT NULL,
    PRIMARY KEY (provider, origin, idx)
);
CREATE TABLE IF NOT EXISTS lifecycle_mentions (
    provider TEXT NOT NULL,
    machine_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    op_id TEXT NOT NULL,
    idx INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS lifecycle_mentions_by_machine ON lifecycle_mentions (provider, machine_id);
CREATE INDEX IF NOT EXISTS lifecycle_mentions_by_op ON lifecycle_mentions (provider, op_id, kind);
"""

#: Columns the fact log gained for this (added to a store written before, then ``backfill``\\ ed).
FACT_COLUMNS = (("ended_at", "INTEGER NOT NULL DEFAULT 0"),)
FACT_INDEXES = "CREATE INDEX IF NOT EXISTS facts_live ON facts (provider, ended_at, idx);"

_RETURN_KINDS = ("ReturnIntent", "Returned", "DrainRequested")


def track(conn: sqlite3.Connection, fact: Fact, idx: int) -> list[str]:
    """Keep the lifecycle tables in step with ``fact`` (just appended at ``idx``); the ended instance refs."""
    p = fact.provider
    match fact:
        case RequestIntent():
            row = conn.execute(
                "SELECT wanted, ended_at FROM lifecycle_ops WHERE provider = ? AND origin = ?", (p, fact.op_id)
            ).fetchone()
            if row is not None and row[0] and row[1]:  # a second intent of an ended op: the daemon ignores it
                conn.execute("UPDATE facts SET ended_at = ? WHERE idx = ?", (idx, idx))
                return []
            _member(conn, p, fact.op_id, idx)
            conn.execute(
                "INSERT INTO lifecycle_ops (provider, origin, wanted) VALUES (?, ?, ?)"
                " ON CONFLICT (provider, origin) DO UPDATE SET wanted = excluded.wanted WHERE wanted = 0",
                (p, fact.op_id, fact.count),
            )
            _close_if_done(conn, p, fact.op_id)
            return []
        case InstanceFact():
            return _machine(conn, p, fact.op_id, fact.machine_id, fact.instance_ref, idx, adopted=False)
        case OrphanAdopted():
            return _machine(conn, p, fact.op_id, fact.machine_id, fact.instance_ref, idx, adopted=True)
        case RequestFailed():
            row = conn.execute(
                "SELECT ended_at FROM lifecycle_ops WHERE provider = ? AND origin = ?", (p, fact.op_id)
            ).fetchone()
            if row is None or row[0]:
                return []  # an intent we never saw, or one already ended: nothing of it is live
            _member(conn, p, fact.op_id, idx)
            conn.execute("UPDATE lifecycle_ops SET closed = 1 WHERE provider = ? AND origin = ?", (p, fact.op_id))
            return _end_if_done(conn, p, [fact.op_id], idx)
        case ReturnIntent() | Returned() | DrainRequested():
            kind = type(fact).__name__
            conn.executemany(
                "INSERT INTO lifecycle_mentions (provider, machine_id, kind, op_id, idx) VALUES (?, ?, ?, ?, ?)",
                [(p, m, kind, fact.op_id, idx) for m in fact.machine_ids],
            )
            ended = _gone(conn, p, fact.machine_ids, idx) if isinstance(fact, Returned) else []
            _end_returns(conn, p, [fact.op_id], idx)  # at once when every machine it names ended already
            return ended
        case Lost() | OrphanReported():
            conn.execute(
                "INSERT INTO lifecycle_mentions (provider, machine_id, kind, op_id, idx) VALUES (?, ?, ?, ?, ?)",
                (p, fact.machine_id, type(fact).__name__, fact.op_id, idx),
            )
            if _origin_ended(conn, p, fact.machine_id):  # about a machine whose lifecycle ended: history at once
                conn.execute("UPDATE facts SET ended_at = ? WHERE idx = ?", (idx, idx))
                return []
            return _gone(conn, p, (fact.machine_id,), idx) if isinstance(fact, Lost) else []
    return []


def _origin_ended(conn: sqlite3.Connection, p: str, machine_id: str) -> bool:
    row = conn.execute(
        "SELECT o.ended_at FROM lifecycle_machines m JOIN lifecycle_ops o"
        " ON o.provider = m.provider AND o.origin = m.origin WHERE m.provider = ? AND m.machine_id = ?",
        (p, machine_id),
    ).fetchone()
    return row is not None and bool(row[0])


def _member(conn: sqlite3.Connection, provider: str, origin: str, idx: int) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO lifecycle_members (provider, origin, idx) VALUES (?, ?, ?)", (provider, origin, idx)
    )


def _machine(
    conn: sqlite3.Connection, p: str, op_id: str, machine_id: str, ref: str, idx: int, *, adopted: bool
) -> list[str]:
    if conn.execute(
        "SELECT 1 FROM lifecycle_machines WHERE provider = ? AND machine_id = ?", (p, machine_id)
    ).fetchone():
        return []  # the same machine reported again: the daemon ignores it, it lives and ends with the first
    row = conn.execute("SELECT ended_at FROM lifecycle_ops WHERE provider = ? AND origin = ?", (p, op_id)).fetchone()
    origin = op_id if row is None or not row[0] else f"#{idx}"  # a late machine of an ended op: its own lifecycle
    conn.execute(
        "INSERT INTO lifecycle_ops (provider, origin, closed) VALUES (?, ?, ?) ON CONFLICT (provider, origin)"
        " DO NOTHING",
        (p, origin, 1 if adopted or origin != op_id else 0),
    )
    conn.execute(
        "INSERT INTO lifecycle_machines (provider, machine_id, origin, instance_ref) VALUES (?, ?, ?, ?)",
        (p, machine_id, origin, ref),
    )
    conn.execute("UPDATE lifecycle_ops SET made = made + 1 WHERE provider = ? AND origin = ?", (p, origin))
    _member(conn, p, origin, idx)
    _close_if_done(conn, p, origin)
    # A machine that was lost or returned before its instance fact came (a retried commit) is gone already.
    if conn.execute(
        "SELECT 1 FROM lifecycle_mentions WHERE provider = ? AND machine_id = ? AND kind IN ('Returned', 'Lost')",
        (p, machine_id),
    ).fetchone():
        return _gone(conn, p, (machine_id,), idx)
    return []


def _close_if_done(conn: sqlite3.Connection, p: str, origin: str) -> None:
    conn.execute(
        "UPDATE lifecycle_ops SET closed = 1 WHERE provider = ? AND origin = ? AND wanted > 0 AND made >= wanted",
        (p, origin),
    )


def _gone(conn: sqlite3.Connection, p: str, machine_ids: tuple[str, ...], idx: int) -> list[str]:
    origins: dict[str, None] = {}
    for machine_id in machine_ids:
        row = conn.execute(
            "SELECT origin FROM lifecycle_machines WHERE provider = ? AND machine_id = ?", (p, machine_id)
        ).fetchone()
        if row is not None:
            conn.execute(
                "UPDATE lifecycle_machines SET gone = 1 WHERE provider = ? AND machine_id = ?", (p, machine_id)
            )
            origins[row[0]] = None
    return _end_if_done(conn, p, list(origins), idx)


def _end_if_done(conn: sqlite3.Connection, p: str, origins: list[str], idx: int) -> list[str]:
    """End each origin op that is closed and has no machine left; their instance refs."""
    refs: list[str] = []
    returns: dict[str, None] = {}
    for origin in origins:
        row = conn.execute(
            "SELECT closed, ended_at FROM lifecycle_ops WHERE provider = ? AND origin = ?", (p, origin)
        ).fetchone()
        if row is None or not row[0] or row[1]:
            continue
        if conn.execute(
            "SELECT 1 FROM lifecycle_machines WHERE provider = ? AND origin = ? AND gone = 0 LIMIT 1", (p, origin)
        ).fetchone():
            continue
        conn.execute("UPDATE lifecycle_ops SET ended_at = ? WHERE provider = ? AND origin = ?", (idx, p, origin))
        conn.execute(
            "UPDATE facts SET ended_at = ? WHERE ended_at = 0 AND idx IN"
            " (SELECT idx FROM lifecycle_members WHERE provider = ? AND origin = ?)",
            (idx, p, origin),
        )
        machines = conn.execute(
            "SELECT machine_id, instance_ref FROM lifecycle_machines WHERE provider = ? AND origin = ?", (p, origin)
        ).fetchall()
        for machine_id, ref in machines:
            if ref:
                refs.append(ref)
            for kind, op_id, member in conn.execute(
                "SELECT kind, op_id, idx FROM lifecycle_mentions WHERE provider = ? AND machine_id = ?",
                (p, machine_id),
            ).fetchall():
                if kind in _RETURN_KINDS:
                    returns[op_id] = None
                else:  # Lost, OrphanReported: they end with the machine's origin
                    conn.execute("UPDATE facts SET ended_at = ? WHERE idx = ? AND ended_at = 0", (idx, member))
    _end_returns(conn, p, list(returns), idx)
    return refs


def _end_returns(conn: sqlite3.Connection, p: str, op_ids: list[str], idx: int) -> None:
    """End each return op whose every machine has an origin that ended."""
    for op_id in op_ids:
        open_machines = conn.execute(
            "SELECT count(*) FROM lifecycle_mentions r LEFT JOIN lifecycle_machines m"
            " ON m.provider = r.provider AND m.machine_id = r.machine_id LEFT JOIN lifecycle_ops o"
            " ON o.provider = m.provider AND o.origin = m.origin"
            " WHERE r.provider = ? AND r.op_id = ? AND r.kind IN ('ReturnIntent', 'Returned', 'DrainRequested')"
            " AND (o.ended_at IS NULL OR o.ended_at = 0)",
            (p, op_id),
        ).fetchone()[0]
        if open_machines == 0:
            conn.execute(
                "UPDATE facts SET ended_at = ? WHERE ended_at = 0 AND idx IN (SELECT idx FROM lifecycle_mentions"
                " WHERE provider = ? AND op_id = ? AND kind IN ('ReturnIntent', 'Returned', 'DrainRequested'))",
                (idx, p, op_id),
            )


def draining(conn: sqlite3.Connection, provider: str, machine_id: str) -> bool:
    """Whether a ``DrainRequested`` fact names ``machine_id`` (its lifecycle lives: the host takes no new work)."""
    row = conn.execute(
        "SELECT 1 FROM lifecycle_mentions WHERE provider = ? AND machine_id = ? AND kind = 'DrainRequested' LIMIT 1",
        (provider, machine_id),
    ).fetchone()
    return row is not None


def ended_instance(conn: sqlite3.Connection, instance_ref: str) -> bool:
    """Whether ``instance_ref`` is a machine whose lifecycle ended (it never joins again)."""
    row = conn.execute(
        "SELECT 1 FROM lifecycle_machines m JOIN lifecycle_ops o ON o.provider = m.provider AND o.origin = m.origin"
        " WHERE m.instance_ref = ? AND o.ended_at > 0 LIMIT 1",
        (instance_ref,),
    ).fetchone()
    return row is not None


def backfill(conn: sqlite3.Connection) -> int:
    """Replay the lifecycle bookkeeping over a log written before it (once, in log order); the facts replayed."""
    count = 0
    for idx, body in conn.execute("SELECT idx, body FROM facts ORDER BY idx").fetchall():
        track(conn, fact_from_json(body), int(idx))
        count += 1
    return count
