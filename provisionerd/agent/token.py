"""The worker agent's secrets: reading its single-use join token, and the rejoin proof derived from it (for controllers
that issue no per-instance credential).

**Where a token may come from.** A 0600 file that the agent deletes once read, or its standard input. Never argv
(every user of the host can read ``/proc/<pid>/cmdline``) and never the environment (inherited by children, shown
by ``ps e``, readable through ``/proc/<pid>/environ`` by the same user). A token file that group or others may read
is refused and left in place: the secret is already exposed, and an operator should see the file.

**Rejoin.** A token admits its worker once. A controller that issues per-instance credentials answers the first
join with one (``JoinReply.credential``, see ``agent.join.Credentials``), and the worker presents that on every
later join: this is what the reference controller does (``refcontroller/credentials.py``), and once a credential
was issued the proof below is refused. For a controller that issues none, the worker presents instead
``REJOIN_PREFIX + rejoin_proof(token, instance_ref)`` in ``Join.token``: an HMAC of its instance reference keyed by
the token. Only a holder of the token can compute it, it names one instance, and it is not the token; but it stays
valid as long as the controller keeps its hash, so a token read after the join still yields it. A controller that
accepts it must at least:

1. When it admits a worker by its token, also store ``rejoin_hash(token, instance_ref)`` durably with the
   used-token record (it holds the token in memory at that moment; it never stores the token or the proof).
2. Treat a ``Join`` whose token starts with ``REJOIN_PREFIX`` as a rejoin: ``rejoin_hash_of_credential(join.token)``
   must equal the stored hash for ``join.instance_ref``, and that host must not be ``lost`` (nor returned), also
   after a restart; otherwise ``ErrorMsg{token_invalid}``. It must not close a live session of the same instance
   for a proof (anyone who read the token can make one).
3. Not fire the timer that marks a disconnected worker ``lost`` (one heartbeat timeout after its connection
   ended) for a host that has rejoined meanwhile: check for a live session of that instance when it fires.
4. The proof is never a valid token (tokens the daemon makes have no ``:``), so the two paths cannot be confused.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import BinaryIO

from provisionerd.domain.errors import ConfigError

#: Tokens the daemon makes are 16..512 characters (``schemas/defs.json`` ``bootstrap.joinToken``).
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512
#: A ``Join.token`` starting with this is a rejoin proof, not a join token. The colon cannot occur in a token the
#: daemon makes (URL-safe base64), so the two never collide.
REJOIN_PREFIX = "rejoin-v1:"
_REJOIN_CONTEXT = b"provisionerd-rejoin-v1\x00"
#: The opt-in address-bound join (protocol §4): ``Join.token`` is this + the cluster's bootstrap secret, read like a
#: join token (a 0600 file deleted once read, or stdin), with ``Join.machineId`` and no ``instanceRef``.
BOOTSTRAP_PREFIX = "bootstrap-v1:"


def _check(token: str, source: str) -> str:
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise ConfigError(f"the join token from {source} must be {MIN_TOKEN_CHARS}..{MAX_TOKEN_CHARS} characters")
    if not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(f"the join token from {source} contains whitespace or control characters")
    return token


def _decode(data: bytes, source: str) -> str:
    if len(data) > MAX_TOKEN_CHARS + 2:
        raise ConfigError(f"{source} holds more than a join token ({len(data)} bytes)")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"the join token from {source} is not ASCII") from None
    # One trailing newline is what `echo` and most writers add; anything else is kept and then refused.
    return _check(text.removesuffix("\n").removesuffix("\r"), source)


def read_private_file(path: Path | str, limit: int, source: str) -> bytes:
    """At most ``limit + 1`` bytes of ``path``, which must be a regular file (not a symbolic link, not a FIFO),
    owned by this user, with no permission bits for group or others. Raises ``ConfigError`` naming ``source`` and
    the problem, never the content."""
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the agent before the type check below.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"cannot open {source}: {why}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{source} is not a regular file")
        if info.st_uid != os.getuid():
            raise ConfigError(f"{source} belongs to uid {info.st_uid}, not to this user ({os.getuid()})")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"{source} has mode {stat.S_IMODE(info.st_mode):04o}: group or others may read it; "
                "it must be 0600 (or stricter). The file is left in place."
            )
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    return data


def read_token_file(path: Path | str, *, delete: bool = True) -> str:
    """Read the token from ``path`` and delete the file (``delete=False``: the caller deletes it once the token is
    kept elsewhere, ``delete_token_file``).

    The file must be a regular file (not a symlink), owned by this user, with no permission bits for group or
    others. Raises ``ConfigError`` (the message names the path and the problem, never the content).
    """
    source = f"token file {str(path)!r}"
    token = _decode(read_private_file(path, MAX_TOKEN_CHARS + 2, source), source)
    if delete:
        delete_token_file(path)
    return token


def delete_token_file(path: Path | str) -> None:
    """Remove a token file once read. Raises ``ConfigError`` when it cannot be removed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # someone else removed it: the token is in memory, which is all we need
    except OSError as exc:
        raise ConfigError(f"cannot delete token file {str(path)!r} after reading it: {exc.strerror}") from None


def read_token_stream(stream: BinaryIO, source: str = "standard input") -> str:
    """Read the token from ``stream`` until EOF (bounded: a stream longer than a token is refused)."""
    data = stream.read(MAX_TOKEN_CHARS + 3)
    return _decode(data or b"", source)


def rejoin_proof(token: str, instance_ref: str) -> str:
    """Hex HMAC-SHA256 of ``instance_ref`` keyed by ``token``: the credential for every join after the first."""
    return hmac.new(token.encode(), _REJOIN_CONTEXT + instance_ref.encode(), hashlib.sha256).hexdigest()


def rejoin_credential(token: str, instance_ref: str) -> str:
    """What a rejoining worker puts in ``Join.token``."""
    return REJOIN_PREFIX + rejoin_proof(token, instance_ref)


def rejoin_hash(token: str, instance_ref: str) -> str:
    """What a controller stores at the first admission (never the proof itself): ``sha256(proof)`` in hex."""
    return hashlib.sha256(rejoin_proof(token, instance_ref).encode()).hexdigest()


def rejoin_hash_of_credential(credential: str) -> str | None:
    """The controller's side: the hash to look up for a presented ``Join.token``; ``None`` if it is no proof."""
    if not credential.startswith(REJOIN_PREFIX):
        return None
    proof = credential[len(REJOIN_PREFIX) :]
    if len(proof) != 64 or any(c not in "0123456789abcdef" for c in proof):
        return None
    return hashlib.sha256(proof.encode()).hexdigest()
