"""Single-use join tokens: made fresh per machine, shown to the provider once, remembered only as SHA-256.

A token is ``secrets.token_urlsafe(32)`` (256 random bits, URL-safe base64: letters, digits, ``-`` and ``_``, so
never a ``:`` that would clash with the rejoin credential format). The controller admits a worker whose token
hashes to a value committed for its instance_ref (see ``refcontroller/workers.py``); the daemon commits only the
hash, in the ``RequestIntent`` and the ``InstanceFact``.

``IssuedToken`` keeps its token out of ``repr`` so that logging an outcome, an exception or a test failure never
prints one. The token leaves the process only inside the ``bootstrap`` of a ``requestMachines`` input, which the
provider runtime redacts from everything it reports.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

import attrs

#: Bytes of randomness per token (the text is ~43 characters, within the contract's 16..512).
TOKEN_BYTES = 32


def token_hash(token: str) -> str:
    """Lowercase hex SHA-256 of the token's UTF-8 bytes: what facts carry instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh single-use join token (no ``:`` in it, by construction of URL-safe base64)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


@attrs.frozen
class IssuedToken:
    """One machine's bootstrap secret: ``instance_ref`` and the token, with its hash for the facts."""

    instance_ref: str
    token: str = attrs.field(repr=False)
    hash: str


def instance_refs(op_id: str, count: int) -> tuple[str, ...]:
    """The daemon's names for the ``count`` machines of ``op_id``: ``<op_id>/<i>``, unique because op_ids are."""
    if count < 1:
        raise ValueError(f"count must be >= 1, not {count!r}")
    return tuple(f"{op_id}/{i}" for i in range(count))


def issue(refs: Sequence[str]) -> tuple[IssuedToken, ...]:
    """A fresh token per instance ref, in order."""
    issued = []
    for ref in refs:
        token = new_token()
        issued.append(IssuedToken(ref, token, token_hash(token)))
    return tuple(issued)
