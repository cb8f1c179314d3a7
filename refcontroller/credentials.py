"""A worker's own credential: what it presents on every join after its first.

**Why a per-instance secret, not a client certificate.** The join token is spent at the first join and exchanged
for a random secret of this one instance (``CREDENTIAL_PREFIX`` + 256 random bits, URL-safe base64), sent once in
the accepted ``JoinReply.credential``; the controller keeps only its SHA-256 (``store_credentials``). A short-lived
client certificate signed from a CSR made on the machine would bind the credential to a key that never leaves it,
but it needs the CA key (or a signing service) on the controller, a renewal protocol and a revocation list, and the
worker certificate every machine holds stays shared anyway (it names a role, not an instance). The secret gives
what the issue asks for with one table: it names one instance, only that instance's holder has it, the controller
revokes it by a row (a restart keeps the revocation), and a store that leaks gives hashes, not credentials. What it
does not give: a credential read off the machine (root on it, a memory dump) works elsewhere until it is revoked.

**What admits, in order** (``workers.admit``):

1. A Join whose token starts with ``CREDENTIAL_PREFIX``: the instance's recorded hash must equal the presented
   one's, the record must not be revoked, and the fact log must not say the machine was returned or lost. The host
   is then ``joined`` again and a session still open for it is closed: presenting the current credential is the
   proof that the old session is the same worker's, half dead. A credential that is not the current one is
   ``credential_stale``; a revoked one ``credential_revoked``; both are refused (``ErrorMsg{tokenInvalid}``), logged
   and counted, and the live session stays.
2. A single-use token (``workers.py``), spent now together with the new credential's hash (one transaction).
3. A rejoin proof (``provisionerd.agent.token``, the scheme before credentials): only for an instance admitted by
   an older controller that has no credential yet, only while no session of it is open, and only once (the proof
   is deleted as it is exchanged). After a credential was issued, the proof is refused.

A first join whose accepted ``JoinReply`` is lost leaves the worker with a spent token and no credential: its
rejoin proof is refused (rule 3), so it cannot join; its machine is returned at the join deadline like one that
never joined. That is the price of never accepting a spent token's derivative again.
"""

from __future__ import annotations

import hashlib
import secrets

#: A ``Join.token`` starting with this is a per-instance credential. The colon never occurs in a join token the
#: daemon makes (URL-safe base64), and ``agent.token.REJOIN_PREFIX`` differs, so the three never collide.
CREDENTIAL_PREFIX = "cred-v1:"
#: 32 random bytes, 43 characters of URL-safe base64 after the prefix.
_SECRET_BYTES = 32

CREDENTIAL_STALE = "credential_stale"
CREDENTIAL_REVOKED = "credential_revoked"
#: A host the controller gave up (its connection gone for the heartbeat timeout): the credential's revocation.
REVOKED_LOST = "lost"


def new_credential() -> str:
    """A fresh credential for one instance (a secret: never log it)."""
    return CREDENTIAL_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def is_credential(token: str) -> bool:
    return token.startswith(CREDENTIAL_PREFIX)


def credential_hash(credential: str) -> str:
    """Lowercase hex SHA-256 of the credential's UTF-8 bytes: all the store keeps."""
    return hashlib.sha256(credential.encode()).hexdigest()


def matches(credential: str, recorded_hash: str) -> bool:
    """Constant-time comparison of a presented credential with the recorded hash."""
    return secrets.compare_digest(credential_hash(credential), recorded_hash)
