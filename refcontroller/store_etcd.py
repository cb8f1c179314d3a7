"""The reference controller's durable state on etcd (issue 22): the same ``FactStore`` interface, replicated.

etcd holds the truth as one **operation log** under the store's prefix: ``ops/<n>`` (zero-padded, so key order is
log order) is one write of the store (a fact appended, a lease grantee recorded, the demand replaced, a join token
used), ``ops/next`` the next ``n``. The primary keeps a **mirror**: an in-memory SQLite ``FactStore`` built by
replaying the log when it is elected, so every read (resync, paging, lifecycle, token claims) is the SQLite code
the embedded store runs, and a fact's index is the one replaying gives (the same on every replica, since the log
is applied in one order by one code). An ``append`` entry carries the fact, its holder and its commit time
(wall-clock epoch seconds, ``CommittedFact.committed_at``), so every replica replays the same time; an entry written
before commit times has no third argument and replays as 0, "not known" (an older replica ignores the third).

**Each write is one etcd transaction that compares the expected next index and the primary's claim**
(``election_etcd.EtcdElection.fence``): ``ops/next == n`` and ``primary == our claim``; it then puts ``ops/<n>``
and ``ops/next = n + 1``. So a deposed primary (its lease expired while it was stopped or partitioned, or another
replica was elected) cannot commit: its compare fails. Only a write etcd accepted is acknowledged.

The mirror applies a write before etcd does (the SQLite code decides what the write is, e.g. whether a token was
already used); when the etcd transaction then fails the mirror is ahead of the log, so the store is **poisoned**:
``StoreFailure`` now and for every later write, and ``deposed`` says why: the replica reads it (its quorum is
stale from then on, ``replica_etcd.EtcdReplicaSet``), steps down and drops the mirror (a new election replays a new
one). A write whose etcd answer was lost (timeout) is treated the same: the
log may or may not hold it, and the next primary's replay decides.

**Each entry carries a checksum** (``"sum"``: ``store_rows.row_sum`` over its number, kind and arguments), as
each row of the SQLite store does: replaying refuses, with ``StoreRefused`` naming the entry, one whose sum does not
match, that is no longer JSON, or whose arguments this code cannot apply. Entries written before checksums have no
``"sum"`` and are applied as found, but once a log holds a summed entry every later one must carry its sum.

The term is not written here: the election advances it in its own transaction (``save_term`` only records it in
the mirror). The incarnation is ``meta/incarnation``, created once by whichever replica first opens the store.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio

from provisionerd.domain.model import CommittedFact, DemandSnapshot, Fact
from refcontroller.election_etcd import EtcdElection
from refcontroller.jsonconv import demand_items_from_json, demand_items_to_json, fact_from_json, fact_to_json
from refcontroller.store import FactStore
from refcontroller.store_etcd_client import EtcdClient, EtcdError, KeyValue, absent, put, value_is
from refcontroller.store_mark import StoreRefused, new_incarnation_id
from refcontroller.store_rows import row_sum
from refcontroller.store_tx import StoreFailure

log = logging.getLogger(__name__)

#: Log entries read per request while replaying.
REPLAY_PAGE = 500
#: Log entries applied to the mirror between two checkpoints of the event loop (``replay_stepped``).
APPLY_STEP = 20


def _op_key(prefix: bytes, n: int) -> bytes:
    return prefix + b"ops/%020d" % n


def _entry_sum(n: int, kind: Any, args: Any) -> int:
    """An entry's checksum: its number, kind and arguments (as canonical JSON: parsing and dumping again gives the
    same text, floats included)."""
    return row_sum("etcd_ops", n, json.dumps([kind, args], separators=(",", ":")).encode())


def open_incarnation(client: EtcdClient, prefix: bytes) -> str:
    """The store's incarnation: created once (the first replica to open it), then read by every other."""
    key = prefix + b"meta/incarnation"
    client.txn([absent(key)], [put(key, new_incarnation_id().encode())])
    kv = client.get(key)
    if kv is None:
        raise StoreRefused(f"etcd store {prefix.decode()!r}: no incarnation after creating one")
    return kv.value.decode()


class EtcdFactStore(FactStore):
    """A ``FactStore`` whose writes go to etcd first-class (see the module docstring). Open with ``replay``."""

    client: EtcdClient
    election: EtcdElection
    prefix: bytes
    next_op: int
    deposed: str
    summed: bool  # an entry with a checksum was replayed: every later one must have one

    @classmethod
    def _empty(cls, client: EtcdClient, election: EtcdElection, prefix: bytes, incarnation: str) -> EtcdFactStore:
        store = cls.open(":memory:", incarnation=incarnation)  # the mirror: FactStore's own schema and code
        assert isinstance(store, EtcdFactStore)
        store.client, store.election, store.prefix = client, election, prefix
        store.deposed = ""
        store.next_op = 1
        store.summed = False
        return store

    def _apply_entries(self, page: list[KeyValue]) -> None:
        """Apply log entries that follow ``next_op`` in order. Raises ``StoreRefused`` on a gap."""
        for kv in page:
            n = self.next_op
            if kv.key != _op_key(self.prefix, n):
                raise StoreRefused(f"etcd store {self.prefix.decode()!r}: entry {n} missing (found {kv.key!r})")
            try:
                op = json.loads(kv.value)
                self._check_sum(n, op)
                self._apply(op)
            except StoreRefused:
                raise
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
                raise StoreRefused(
                    f"etcd store {self.prefix.decode()!r}: entry {n} ({kv.key.decode(errors='replace')}) cannot be"
                    f" applied: {type(exc).__name__}: {str(exc)[:200]}"
                ) from None
            self.next_op += 1

    def _check_sum(self, n: int, op: Any) -> None:
        if not isinstance(op, dict):
            raise ValueError(f"not an object: {type(op).__name__}")
        if "sum" not in op:
            if self.summed:
                raise StoreRefused(
                    f"etcd store {self.prefix.decode()!r}: entry {n} has no checksum but an earlier entry has one"
                )
            return
        self.summed = True
        if op["sum"] != _entry_sum(n, op.get("op"), op.get("args")):
            raise StoreRefused(
                f"etcd store {self.prefix.decode()!r}: entry {n} ({_op_key(self.prefix, n).decode()}) fails its"
                " checksum: the log was changed outside the controller"
            )

    def _check_next(self, stored_next: KeyValue | None) -> None:
        n = self.next_op
        if (int(stored_next.value) if stored_next else 1) != n:
            raise StoreRefused(f"etcd store {self.prefix.decode()!r}: ops/next disagrees with the {n - 1} entries")
        log.info("etcd store replayed: %d entries, %d facts, incarnation %s", n - 1, self.count(), self.incarnation)

    def _page(self) -> list[KeyValue]:
        return self.client.range_from(_op_key(self.prefix, self.next_op), self.prefix + b"ops/:", REPLAY_PAGE)

    @classmethod
    def replay(cls, client: EtcdClient, election: EtcdElection, prefix: bytes = b"provisionerd/") -> EtcdFactStore:
        """Build the mirror from the whole log, blocking (``replay_stepped`` is the event loop's). Raises
        ``EtcdError`` (etcd unreachable) or ``StoreRefused`` (a log with a gap, or an entry this code cannot
        apply)."""
        store = cls._empty(client, election, prefix, open_incarnation(client, prefix))
        while page := store._page():  # ':' follows '9'
            store._apply_entries(page)
        store._check_next(client.get(prefix + b"ops/next"))
        return store

    @classmethod
    async def replay_stepped(
        cls, client: EtcdClient, election: EtcdElection, prefix: bytes = b"provisionerd/", *, step: int = APPLY_STEP
    ) -> EtcdFactStore:
        """``replay`` without blocking the event loop for more than one step: every etcd read runs in a worker
        thread, and the entries are applied to the mirror (whose SQLite connection belongs to the event loop)
        ``step`` at a time, with a checkpoint between steps. A store that fails is closed."""
        incarnation = await trio.to_thread.run_sync(open_incarnation, client, prefix)
        store = cls._empty(client, election, prefix, incarnation)
        try:
            while page := await trio.to_thread.run_sync(store._page):
                for start in range(0, len(page), step):
                    store._apply_entries(page[start : start + step])
                    await trio.lowlevel.checkpoint()
            store._check_next(await trio.to_thread.run_sync(client.get, prefix + b"ops/next"))
        except BaseException:
            store.close()
            raise
        return store

    # --- replaying --------------------------------------------------------------------------------------------

    def _apply(self, op: dict[str, Any]) -> None:
        kind, args = op.get("op"), op.get("args", [])
        match kind:
            case "append":  # an entry from before commit times has no third argument: its time is not known (0)
                FactStore.append(self, fact_from_json(args[0]), args[1], float(args[2]) if len(args) > 2 else 0.0)
            case "grantee":
                FactStore.save_grantee(self, args[0], args[1])
            case "demand":
                FactStore.save_demand(self, DemandSnapshot(int(args[0]), demand_items_from_json(args[1])))
            case "token":
                FactStore.use_token(self, args[0], args[1], float(args[2]), args[3], *args[4:5])
            case "exchange":
                FactStore.exchange_rejoin_proof(self, args[0], args[1], args[2], float(args[3]))
            case "revoke":
                FactStore.revoke_credential(self, args[0], args[1], float(args[2]))
            case "delivered":
                FactStore.credential_delivered(self, args[0], float(args[1]))
            case "reissue":
                FactStore.reissue_credential(self, args[0], args[1], args[2], float(args[3]))
            case _:
                raise StoreRefused(f"etcd store {self.prefix.decode()!r}: unknown entry {kind!r}")

    # --- writes: the mirror first, then the fenced etcd transaction ---------------------------------------------

    def _check_writable(self) -> None:
        if self.deposed:
            raise StoreFailure(f"this replica was deposed: {self.deposed}")

    def _log(self, kind: str, *args: Any) -> None:
        n = self.next_op
        next_key = self.prefix + b"ops/next"
        expected = value_is(next_key, str(n).encode()) if n > 1 else absent(next_key)
        entry = {"op": kind, "args": list(args), "sum": _entry_sum(n, kind, list(args))}
        body = json.dumps(entry, separators=(",", ":")).encode()
        try:
            ok = self.client.txn(
                [self.election.fence(), expected],
                [put(_op_key(self.prefix, n), body), put(next_key, str(n + 1).encode())],
            )
        except EtcdError as exc:
            self._depose(f"entry {n} not confirmed by etcd: {exc}")
            raise StoreFailure(f"etcd: {exc}") from exc
        if not ok:
            self._depose(f"entry {n} refused: the primary claim or the next index moved (another primary?)")
            raise StoreFailure(f"not committed: {self.deposed}")
        self.next_op = n + 1

    def _depose(self, reason: str) -> None:
        self.deposed = reason
        log.warning("etcd store deposed: %s", reason)

    def save_term(self, term: int) -> None:
        """The mirror only: the election advanced the term in etcd, in the transaction that made us primary."""
        FactStore.save_term(self, term)

    def save_demand(self, snapshot: DemandSnapshot) -> None:
        self._check_writable()
        FactStore.save_demand(self, snapshot)
        self._log("demand", snapshot.seq, demand_items_to_json(snapshot.items))

    def save_grantee(self, provider: str, holder: str) -> None:
        self._check_writable()
        FactStore.save_grantee(self, provider, holder)
        self._log("grantee", provider, holder)

    def append(self, fact: Fact, holder: str, at: float = 0.0) -> CommittedFact:
        self._check_writable()
        committed = FactStore.append(self, fact, holder, at)
        self._log("append", fact_to_json(fact), holder, committed.committed_at)  # every replica replays the time
        return committed

    def use_token(
        self, token_hash: str, instance_ref: str, at: float, rejoin_hash: str = "", credential_hash: str = ""
    ) -> bool:
        self._check_writable()
        used = FactStore.use_token(self, token_hash, instance_ref, at, rejoin_hash, credential_hash)
        if used:
            self._log("token", token_hash, instance_ref, at, rejoin_hash, credential_hash)
        return used

    # The per-instance credentials (``store_credentials``): only hashes, replicated like every other write, so a
    # new primary admits and refuses the same workers.

    def exchange_rejoin_proof(self, instance_ref: str, rejoin_hash: str, credential_hash: str, at: float) -> bool:
        self._check_writable()
        exchanged = FactStore.exchange_rejoin_proof(self, instance_ref, rejoin_hash, credential_hash, at)
        if exchanged:
            self._log("exchange", instance_ref, rejoin_hash, credential_hash, at)
        return exchanged

    def credential_delivered(self, instance_ref: str, at: float) -> bool:
        self._check_writable()
        changed = FactStore.credential_delivered(self, instance_ref, at)
        if changed:
            self._log("delivered", instance_ref, at)
        return changed

    def reissue_credential(self, token_hash: str, instance_ref: str, credential_hash: str, at: float) -> bool:
        self._check_writable()
        reissued = FactStore.reissue_credential(self, token_hash, instance_ref, credential_hash, at)
        if reissued:
            self._log("reissue", token_hash, instance_ref, credential_hash, at)
        return reissued

    def revoke_credential(self, instance_ref: str, reason: str, at: float) -> bool:
        self._check_writable()
        revoked = FactStore.revoke_credential(self, instance_ref, reason, at)
        if revoked:
            self._log("revoke", instance_ref, reason, at)
        return revoked
