"""Worker admission by single-use join token, and the table of host states.

**Which hashes admit a worker.** A worker joins with ``(instance_ref, token)``. It is admitted when
``sha256(token)`` (lowercase hex) was committed for that same ``instance_ref`` by either

- a ``RequestIntent``: ``token_hashes[i]`` belongs to ``instance_refs[i]`` (same position), or
- an ``InstanceFact``: its ``token_hash`` belongs to its ``instance_ref``.

The daemon commits the intent *before* calling the provider and the instance fact *after* the machine is reported,
and a fast machine can boot and join in between; accepting the intent's hashes is what makes that join work. A
token whose hash was committed for a different ``instance_ref`` is refused, as is an unknown one.

**Once.** The first admission marks the hash used, durably (the store's ``used_tokens``), so a second join with the
same token is refused even after a restart or a failover. The token itself is never stored or logged.

**Host states.** ``joined`` at admission, then ``idle``/``busy`` as the worker reports, and ``lost`` when its
connection has been gone for the heartbeat timeout (the server decides when; this table only records). ``since``
is the wall-clock time the host entered its status. The table is kept in memory, shared by all replicas of the
process (like the worker join facts of the real controller); a lost host stays ``lost``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

import attrs

from provisionerd.agent.token import rejoin_hash, rejoin_hash_of_credential
from provisionerd.domain.model import HostState, HostStatus
from refcontroller.commits import Rejection
from refcontroller.store import FactStore

TOKEN_INVALID = "token_invalid"
MAX_TOKEN_CHARS = 1024


def token_hash(token: str) -> str:
    """Lowercase hex SHA-256 of the token's UTF-8 bytes: what facts carry instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def admit(store: FactStore, instance_ref: str, token: str, wall_now: float) -> HostState | Rejection:
    """Admit a worker (consuming its token) or say why not. The detail never contains the token."""
    if not instance_ref or not token or len(token) > MAX_TOKEN_CHARS:
        return Rejection(TOKEN_INVALID, "a worker joins with an instance_ref and a token")
    proof = rejoin_hash_of_credential(token)
    if proof is not None:  # a rejoin: the proof of the token this instance was admitted with
        digest = store.rejoin_token_hash(instance_ref, proof) or ""
        claims = [claim for claim in store.token_claims(digest) if claim.instance_ref == instance_ref]
        if not claims:
            return Rejection(TOKEN_INVALID, f"instance {instance_ref!r} was never admitted with this rejoin proof")
    else:
        digest = token_hash(token)
        claims = [claim for claim in store.token_claims(digest) if claim.instance_ref == instance_ref]
        if not claims:
            return Rejection(TOKEN_INVALID, f"no committed fact gives this token to instance {instance_ref!r}")
        if not store.use_token(digest, instance_ref, wall_now, rejoin_hash(token, instance_ref)):
            return Rejection(TOKEN_INVALID, f"the token of instance {instance_ref!r} was already used")
    # Prefer the claim that came from an instance fact: it knows the machine id, hostname and address.
    claim = max(claims, key=lambda c: bool(c.machine_id))
    return HostState(
        instance_ref=instance_ref,
        provider=claim.provider,
        machine_id=claim.machine_id,
        status=HostStatus.JOINED,
        since=wall_now,
        hostname=claim.hostname,
        address=claim.address,
    )


@attrs.define(eq=False)
class HostTable:
    """``instance_ref -> HostState``. Every change returns the new state (or ``None`` if nothing changed)."""

    _hosts: dict[str, HostState] = attrs.field(factory=dict)

    def add(self, host: HostState) -> HostState:
        self._hosts[host.instance_ref] = host
        return host

    def get(self, instance_ref: str) -> HostState | None:
        return self._hosts.get(instance_ref)

    def set_status(self, instance_ref: str, status: HostStatus, wall_now: float) -> HostState | None:
        """Move a known, not-lost host to ``status``; ``None`` if unknown, lost, or already in it."""
        host = self._hosts.get(instance_ref)
        if host is None or host.status in (status, HostStatus.LOST):
            return None
        changed = attrs.evolve(host, status=status, since=wall_now)
        self._hosts[instance_ref] = changed
        return changed

    def identify(self, instance_ref: str, machine_id: str, hostname: str, address: str) -> HostState | None:
        """Fill in what an instance fact committed after the worker joined says about its host (a worker that
        joined on its intent's token had no machine id yet). Only empty fields are filled; ``None`` if unknown or
        nothing changed."""
        host = self._hosts.get(instance_ref)
        if host is None:
            return None
        changed = attrs.evolve(
            host,
            machine_id=host.machine_id or machine_id,
            hostname=host.hostname or hostname,
            address=host.address or address,
        )
        if changed == host:
            return None
        self._hosts[instance_ref] = changed
        return changed

    def drop(self, instance_refs: Collection[str]) -> int:
        """Forget the hosts of machines whose lifecycle ended (``store_lifecycle``); how many there were."""
        return sum(self._hosts.pop(ref, None) is not None for ref in instance_refs)

    def __len__(self) -> int:
        return len(self._hosts)

    def for_providers(self, providers: Collection[str]) -> list[HostState]:
        return sorted((h for h in self._hosts.values() if h.provider in providers), key=lambda h: h.instance_ref)

    def all(self) -> list[HostState]:
        return sorted(self._hosts.values(), key=lambda h: h.instance_ref)
