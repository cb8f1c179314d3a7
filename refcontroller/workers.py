"""Worker admission by single-use join token, then by the instance's own credential, and the table of host states.

**Which hashes admit a worker.** A worker's first join carries ``(instance_ref, token)``. It is admitted when
``sha256(token)`` (lowercase hex) was committed for that same ``instance_ref`` by either

- a ``RequestIntent``: ``token_hashes[i]`` belongs to ``instance_refs[i]`` (same position), or
- an ``InstanceFact``: its ``token_hash`` belongs to its ``instance_ref``.

The daemon commits the intent *before* calling the provider and the instance fact *after* the machine is reported,
and a fast machine can boot and join in between; accepting the intent's hashes is what makes that join work. A
token whose hash was committed for a different ``instance_ref`` is refused, as is an unknown one.

**Once, then the instance's own credential.** The first admission marks the hash used and records the hash of the
instance's new credential, durably and in one transaction (the store's ``used_tokens`` and
``worker_credentials``), so a second join with the same token is refused even after a restart or a failover. Every
later join presents the credential (``credentials.py``: what admits, in order, and why a secret and not a
certificate). Neither the token nor the credential is ever stored or logged.

**Revocation.** A machine the fact log says was returned or lost is refused on every path. A host the controller
gave up (``lost``: its connection gone for the heartbeat timeout) has its credential revoked in the store by
:func:`revoke_lost`, so it stays refused after a restart, when the host table below is empty again.

**Host states.** ``joined`` at admission, then ``idle``/``busy`` as the worker reports, and ``lost`` when its
connection has been gone for the heartbeat timeout (the server decides when; this table only records). ``since``
is the wall-clock time the host entered its status. ``draining`` (any status) once a ``DrainRequested`` fact names
its machine: work is placed only on :meth:`HostTable.placeable` hosts (joined or idle, not draining), so a
draining host finishes what it runs and gets nothing new; the daemon returns it when idle or at its drain timeout.
The table is kept in memory, shared by all replicas of the process (like the worker join facts of the real
controller); a lost host stays ``lost``, and a rejoining one is draining again if the facts say so.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Mapping

import attrs

from provisionerd.agent.token import rejoin_hash_of_credential
from provisionerd.domain.model import HostState, HostStatus
from refcontroller import credentials, credentials_address
from refcontroller.commits import Rejection
from refcontroller.credentials_address import AddressBoundJoin
from refcontroller.store import FactStore, StoreFailure, TokenClaim

log = logging.getLogger(__name__)

TOKEN_INVALID = "token_invalid"
#: Every reason a worker's Join is refused for its secret: each is answered ``ErrorMsg{tokenInvalid}``.
SECRET_REFUSALS = frozenset(
    {TOKEN_INVALID, credentials.CREDENTIAL_STALE, credentials.CREDENTIAL_REVOKED, *credentials_address.REASONS}
)
#: The longest ``Join.token`` looked at (join tokens are 16..512 characters, ``agent.token``; credentials 51).
MAX_TOKEN_CHARS = 1024


def token_hash(token: str) -> str:
    """Lowercase hex SHA-256 of the token's UTF-8 bytes: what facts carry instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def admit(
    store: FactStore,
    instance_ref: str,
    token: str,
    wall_now: float,
    *,
    credential: str | None = None,
    live: bool = False,
) -> HostState | Rejection:
    """Admit a worker (consuming its token, or checking its credential) or say why not.

    ``credential``: the new credential a token (or rejoin proof) is exchanged for, which the caller hands to the
    worker in the accepted ``JoinReply`` (``None``: a random one nobody learns, for callers that never rejoin).
    ``live``: a session of ``instance_ref`` is open now. The detail never contains a secret.

    Raises:
        StoreFailure: the token's use or the credential could not be recorded (nothing was).
    """
    if not instance_ref or not token or len(token) > MAX_TOKEN_CHARS:
        return Rejection(TOKEN_INVALID, "a worker joins with an instance_ref and a token")
    if store.instance_gone(instance_ref):
        return Rejection(credentials.CREDENTIAL_REVOKED, f"instance {instance_ref!r} was returned or lost")
    fresh_hash = credentials.credential_hash(credential or credentials.new_credential())
    if credentials.is_credential(token):
        record = store.credential(instance_ref)
        if record is None or not credentials.matches(token, record.credential_hash):
            return Rejection(credentials.CREDENTIAL_STALE, f"not the current credential of {instance_ref!r}")
        if record.revoked:
            return Rejection(credentials.CREDENTIAL_REVOKED, f"the credential of {instance_ref!r} was revoked")
        claims = store.instance_claims(instance_ref)
    elif (proof := rejoin_hash_of_credential(token)) is not None:  # the scheme before credentials: once
        if store.credential(instance_ref) is not None:
            return Rejection(TOKEN_INVALID, f"instance {instance_ref!r} holds a credential: its rejoin proof is spent")
        if live:
            return Rejection(TOKEN_INVALID, f"instance {instance_ref!r} has a live session: a proof cannot replace it")
        if not store.exchange_rejoin_proof(instance_ref, proof, fresh_hash, wall_now):
            return Rejection(TOKEN_INVALID, f"instance {instance_ref!r} was never admitted with this rejoin proof")
        claims = store.instance_claims(instance_ref)
    else:
        digest = token_hash(token)
        claims = [claim for claim in store.token_claims(digest) if claim.instance_ref == instance_ref]
        if not claims:
            return Rejection(TOKEN_INVALID, f"no committed fact gives this token to instance {instance_ref!r}")
        if not store.use_token(digest, instance_ref, wall_now, credential_hash=fresh_hash):
            # Spent: by this instance, whose credential may never have reached it (the reply was lost), then a new
            # one replaces it, unless a session of it is live or it was delivered (``store_credentials``).
            if live or not store.reissue_credential(digest, instance_ref, fresh_hash, wall_now):
                return Rejection(TOKEN_INVALID, f"the token of instance {instance_ref!r} was already used")
            log.info("credential re-issued instance_ref=%r: the first was never delivered", instance_ref)
    if not claims:  # a credential outlived its claims: nothing says whose machine this is
        return Rejection(credentials.CREDENTIAL_STALE, f"no committed fact names instance {instance_ref!r}")
    return _joined(instance_ref, claims, wall_now)


def admit_by_address(
    store: FactStore,
    policy: AddressBoundJoin | None,
    machine_id: str,
    secret: str,
    peer: str,
    wall_now: float,
    *,
    credential: str | None = None,
    live: frozenset[str] = frozenset(),
) -> HostState | Rejection:
    """The opt-in address-bound join (``credentials_address``): admit the worker claiming ``machine_id`` from
    ``peer`` once, as the instance whose fact names that machine, spending its token; or say why not. Once: unless
    the credential that join was issued never reached the worker (``store_credentials``: not delivered, no session
    of the instance in ``live``), when a new one replaces it.

    Raises:
        StoreFailure: the token's use or the credential could not be recorded (nothing was).
    """
    ca = credentials_address
    if policy is None:
        return Rejection(ca.ADDRESS_BOUND_OFF, "this controller admits no address-bound join")
    if not policy.admits_secret(secret):
        return Rejection(ca.BOOTSTRAP_INVALID, "not the cluster's bootstrap secret")
    claims = store.machine_claims(machine_id[:256])
    if len({claim.instance_ref for _, claim in claims}) != 1:
        found = "no instance fact" if not claims else "more than one instance fact"
        return Rejection(ca.MACHINE_UNKNOWN, f"{found} names machine {machine_id[:256]!r}")
    digest, claim = claims[0]
    ref = claim.instance_ref
    held = store.credential(ref)
    again = held is not None and not held.delivered_at and not held.revoked and ref not in live
    if store.instance_gone(ref) or (held is not None and not again):
        return Rejection(ca.MACHINE_JOINED, f"machine {machine_id!r} ({ref!r}) joined before or is gone")
    if not ca.same_address(claim.address, peer):
        return Rejection(
            ca.ADDRESS_MISMATCH,
            f"machine {machine_id!r} was reported at {claim.address!r}, the join came from {peer!r}",
        )
    fresh_hash = credentials.credential_hash(credential or credentials.new_credential())
    if again:
        if not store.reissue_credential(digest, ref, fresh_hash, wall_now):
            return Rejection(ca.MACHINE_JOINED, f"machine {machine_id!r} ({ref!r}) joined before")
        log.info("credential re-issued machine_id=%r instance_ref=%r: the first was never delivered", machine_id, ref)
    elif not store.use_token(digest, ref, wall_now, credential_hash=fresh_hash):
        return Rejection(ca.MACHINE_JOINED, f"machine {machine_id!r} ({ref!r}) joined before")
    log.info("address-bound join machine_id=%r instance_ref=%r peer=%s", machine_id, ref, peer)
    return _joined(ref, [claim], wall_now)


def _joined(instance_ref: str, claims: list[TokenClaim], wall_now: float) -> HostState:
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


#: The most capability entries a host keeps, and the longest key and value (``Join.capabilities``, protocol §4).
MAX_CAPABILITIES = 8
MAX_CAPABILITY_KEY = 32
MAX_CAPABILITY_VALUE = 64


def reported_capabilities(reported: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """What a worker's ``Join.capabilities`` (or a re-probe's ``WorkerStatus.capabilities``) may put in its host
    state, and how many entries were dropped: the first ``MAX_CAPABILITIES`` in key order whose key is 1..32
    characters of ``[A-Za-z0-9_.:-]`` and whose value is at most 64 printable characters. The controller only
    carries the report; the daemon judges it."""
    kept: dict[str, str] = {}
    dropped = 0
    for key in sorted(reported):
        value = reported[key]
        if (
            len(kept) < MAX_CAPABILITIES
            and 0 < len(key) <= MAX_CAPABILITY_KEY
            and all(c.isascii() and (c.isalnum() or c in "_.:-") for c in key)
            and len(value) <= MAX_CAPABILITY_VALUE
            and value.isprintable()
        ):
            kept[key] = value
        else:
            dropped += 1
    return kept, dropped


def revoke_lost(store: FactStore, instance_ref: str, wall_now: float) -> bool:
    """Revoke the credential of a host given up as lost, durably; ``False`` if there was none to revoke or the
    store failed (logged: the host is refused in memory until a restart, as before credentials)."""
    try:
        revoked = store.revoke_credential(instance_ref, credentials.REVOKED_LOST, wall_now)
    except StoreFailure as exc:
        log.warning("credential of lost host %r not revoked durably: %s", instance_ref, exc)
        return False
    if revoked:
        log.info("credential revoked instance_ref=%r reason=lost", instance_ref)
    return revoked


def _ref(host: HostState) -> str:
    return host.instance_ref


@attrs.define(eq=False)
class HostTable:
    """``instance_ref -> HostState``. Every change returns the new state (or ``None`` if nothing changed)."""

    _hosts: dict[str, HostState] = attrs.field(factory=dict)

    def add(self, host: HostState) -> HostState:
        self._hosts[host.instance_ref] = host
        return host

    def get(self, instance_ref: str) -> HostState | None:
        return self._hosts.get(instance_ref)

    def set_status(
        self, instance_ref: str, status: HostStatus, wall_now: float, reclaim_at: float = 0.0, rebalance_at: float = 0.0
    ) -> HostState | None:
        """Move a known, not-lost host to ``status`` and record its reclaim notices (protocol §6.4: a notice once
        given stays, the later time of two wins); ``None`` if unknown, lost, or nothing changed."""
        host = self._hosts.get(instance_ref)
        if host is None or host.status is HostStatus.LOST:
            return None
        reclaim_at, rebalance_at = max(host.reclaim_at, reclaim_at), max(host.rebalance_at, rebalance_at)
        if host.status is status and (reclaim_at, rebalance_at) == (host.reclaim_at, host.rebalance_at):
            return None
        since = host.since if host.status is status else wall_now
        changed = attrs.evolve(host, status=status, since=since, reclaim_at=reclaim_at, rebalance_at=rebalance_at)
        self._hosts[instance_ref] = changed
        return changed

    def drain(self, instance_ref: str) -> HostState | None:
        """Mark a known, not-lost host draining (no new work is placed on it); ``None`` if unknown, lost or already."""
        host = self._hosts.get(instance_ref)
        if host is None or host.draining or host.status is HostStatus.LOST:
            return None
        changed = attrs.evolve(host, draining=True)
        self._hosts[instance_ref] = changed
        return changed

    def by_machine(self, provider: str, machine_ids: Collection[str]) -> list[str]:
        """The instance refs of the hosts of ``provider``'s ``machine_ids`` (one pass over the table)."""
        wanted = set(machine_ids)
        return [ref for ref, h in self._hosts.items() if h.provider == provider and h.machine_id in wanted]

    def placeable(self) -> list[HostState]:
        """The hosts new work may be placed on: joined or idle, not draining and without a reclaim notice (by
        instance_ref)."""
        free = (HostStatus.JOINED, HostStatus.IDLE)
        hosts = self._hosts.values()
        return sorted((h for h in hosts if h.status in free and not h.draining and not h.noticed), key=_ref)

    def report(self, instance_ref: str, capabilities: Mapping[str, str], probed_at: float = 0.0) -> HostState | None:
        """Record what the worker of a known host reported: at its join (``probed_at`` 0), or from a re-probe after
        it (``WorkerStatus.probedAt``, protocol §6.4 "Health after join"), which replaces the whole report. ``None``
        if unknown, lost, or unchanged."""
        host = self._hosts.get(instance_ref)
        if host is None or (probed_at and host.status is HostStatus.LOST):
            return None
        if (host.capabilities, host.probed_at) == (capabilities, probed_at):
            return None
        changed = attrs.evolve(host, capabilities=dict(capabilities), probed_at=probed_at)
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
