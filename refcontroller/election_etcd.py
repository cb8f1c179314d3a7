"""Electing the reference controller's primary on etcd (issue 22): one replica process per ``EtcdElection``.

Keys, under the store's ``prefix``:

- ``term``: the HA term, a decimal counter. It only grows: a replica becomes primary in **one transaction** that
  compares ``term`` with the value it read and ``primary`` with absent, and then writes ``term + 1`` and the
  ``primary`` claim together. Two replicas can never win one term, and a term is never given twice, whatever
  crashes (it is in etcd's replicated log, not in any replica's memory).
- ``primary``: the claim ``{"name", "address", "term"}`` (JSON), attached to the replica's etcd lease of
  ``lease_ttl`` seconds. A primary that stops refreshing its lease (killed, stopped, partitioned from the
  majority) loses the key when the lease expires, and another replica's campaign succeeds.

**Fencing.** Every write of the primary's store (``store_etcd.EtcdFactStore``) is a transaction that compares
``primary`` with this exact claim: once the claim is gone (lease expired) or replaced (another term), the write
fails and the replica steps down. A primary woken from SIGSTOP past its lease cannot commit.

**Fresh quorum.** ``confirm()`` refreshes the lease and then reads ``primary`` (a linearizable range: answered only
through a majority of members) and checks it is still our claim; ``confirmed_at`` is the trio time the confirming
request was *sent*. Grants and renewals need ``confirmed_at`` within ``T_check`` (``quorum_fresh``), so a primary
cut from the majority stops granting within ``T_check`` even before its lease expires.

Synchronous (the client blocks, bounded by its timeout); ``refcontroller.replica_etcd`` runs it on trio.
"""

from __future__ import annotations

import json
import logging

import attrs

from refcontroller.store_etcd_client import EtcdClient, EtcdError, absent, delete, put, value_is

log = logging.getLogger(__name__)


@attrs.frozen
class Claim:
    """A primary's claim (the value of the ``primary`` key)."""

    name: str
    address: str
    term: int

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "address": self.address, "term": self.term}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Claim | None:
        try:
            doc = json.loads(raw)
            return cls(str(doc["name"]), str(doc["address"]), int(doc["term"]))
        except (ValueError, KeyError, TypeError):
            return None


@attrs.define(eq=False)
class EtcdElection:
    client: EtcdClient
    name: str
    address: str
    prefix: bytes = b"provisionerd/"
    lease_ttl: int = 3
    lease: int = 0
    claim: Claim | None = None  # ours, while we believe we are primary

    @property
    def term_key(self) -> bytes:
        return self.prefix + b"term"

    @property
    def primary_key(self) -> bytes:
        return self.prefix + b"primary"

    def stored_term(self) -> int:
        kv = self.client.get(self.term_key)
        return int(kv.value) if kv is not None else 0

    def current(self) -> Claim | None:
        """The primary's claim as etcd holds it now (a linearizable read), or None."""
        kv = self.client.get(self.primary_key)
        return Claim.decode(kv.value) if kv is not None else None

    def _fresh_lease(self) -> int:
        if self.lease and self.client.keepalive(self.lease) > 0:
            return self.lease
        self.lease = self.client.grant(self.lease_ttl)
        return self.lease

    def campaign(self) -> Claim | None:
        """Try once to become primary: the new claim (term advanced in the same transaction), or None when another
        replica holds the claim (or won the race). Raises ``EtcdError`` when etcd cannot be reached."""
        if self.current() is not None:
            return None
        lease = self._fresh_lease()
        term_kv = self.client.get(self.term_key)
        term = int(term_kv.value) if term_kv is not None else 0
        claim = Claim(self.name, self.address, term + 1)
        term_unchanged = value_is(self.term_key, str(term).encode()) if term_kv is not None else absent(self.term_key)
        won = self.client.txn(
            [absent(self.primary_key), term_unchanged],
            [put(self.term_key, str(term + 1).encode()), put(self.primary_key, claim.encode(), lease)],
        )
        if not won:
            return None
        self.claim = claim
        log.info("elected primary name=%s term=%d address=%s", self.name, claim.term, self.address)
        return claim

    def fence(self) -> dict[str, object]:
        """The compare every write of the primary carries: our claim still holds."""
        claim = self.claim  # read once: a confirm in another worker thread may clear it meanwhile
        if claim is None:
            raise EtcdError("not the primary: no claim to write under")
        return value_is(self.primary_key, claim.encode())

    def confirm(self) -> bool:
        """Refresh our lease and read the claim back through a majority: whether we are still primary. A lost
        claim is final for this term (``claim`` is cleared: the replica steps down). Calls may overlap (each in a
        worker thread): the claim is read once, so one that another call cleared meanwhile is simply lost."""
        claim = self.claim
        if claim is None:
            return False
        if self.client.keepalive(self.lease) <= 0 or self.current() != claim:
            log.warning("lost the primary claim name=%s term=%d", self.name, claim.term)
            self.claim = None
            return False
        return True

    def resign(self) -> None:
        """Give the claim up (a clean stop): delete it if it is still ours, and revoke our lease."""
        try:
            if self.claim is not None:
                self.client.txn([self.fence()], [delete(self.primary_key)])
            if self.lease:
                self.client.revoke(self.lease)
        except EtcdError as exc:
            log.warning("resign name=%s: %s (the claim expires with its lease)", self.name, exc)
        self.claim = None
        self.lease = 0
