"""Small builders of facts and demand for the reference controller's tests."""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any

from provisionerd.domain.model import DemandItem, Epoch, InstanceFact, RequestIntent, ResourceShape
from refcontroller import store_rows
from refcontroller.store_etcd_client import KeyValue


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def intent(provider: str, epoch: Epoch, op_id: str = "op-1", refs: tuple[str, ...] = ("i-1",)) -> RequestIntent:
    """An intent whose instance ``ref`` joins with the token ``"tok-" + ref``."""
    return RequestIntent(
        provider=provider,
        epoch=epoch,
        op_id=op_id,
        template_id="t1",
        count=len(refs),
        instance_refs=refs,
        token_hashes=tuple(sha(f"tok-{ref}") for ref in refs),
    )


def instance(provider: str, epoch: Epoch, ref: str, op_id: str = "op-1", token: str | None = None) -> InstanceFact:
    return InstanceFact(
        provider=provider,
        epoch=epoch,
        op_id=op_id,
        instance_ref=ref,
        machine_id=f"m-{ref}",
        template_id="t1",
        token_hash=sha(token if token is not None else f"tok-{ref}"),
        hostname=f"host-{ref}",
    )


def item(demand_id: str = "d1", count: int = 2, ncpus: int = 4) -> DemandItem:
    return DemandItem(demand_id=demand_id, shape=ResourceShape(ncpus=ncpus), count=count)


def before_row_checksums(conn: sqlite3.Connection) -> None:
    """Make a store file look written by a controller from before row checksums (``refcontroller.store_rows``):
    no triggers, no ``rowsum`` column."""
    for table in store_rows.TABLES:
        conn.execute(f"DROP TRIGGER IF EXISTS {table}_rowsum_insert")
        conn.execute(f"DROP TRIGGER IF EXISTS {table}_rowsum_update")
        conn.execute(f"ALTER TABLE {table} DROP COLUMN rowsum")
    conn.commit()


class FakeEtcd:
    """An etcd keyspace in a dict with one writer: only ``absent`` compares are checked."""

    def __init__(self) -> None:
        self.kv: dict[bytes, bytes] = {}

    def txn(self, compares: list[dict[str, Any]], puts: list[dict[str, Any]]) -> bool:
        import base64

        if any(c.get("target") == "CREATE" and base64.b64decode(c["key"]) in self.kv for c in compares):
            return False  # ``absent(key)`` failed (the incarnation is created once)
        for op in puts:
            request = op["requestPut"]
            self.kv[base64.b64decode(request["key"])] = base64.b64decode(request["value"])
        return True

    def get(self, key: bytes) -> KeyValue | None:
        return KeyValue(key, self.kv[key], 0, 0, 0) if key in self.kv else None

    def range_from(self, start: bytes, end: bytes, limit: int) -> list[KeyValue]:
        keys = sorted(k for k in self.kv if start <= k < end)[:limit]
        return [KeyValue(k, self.kv[k], 0, 0, 0) for k in keys]


class FakeElection:
    def fence(self) -> dict[str, object]:
        return {}
