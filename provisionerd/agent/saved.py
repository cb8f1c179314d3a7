"""The agent's secrets on its machine's disk (``--state-file``), so that a restarted agent keeps its way in.

A machine's init system restarts an agent that died (a crash, an OOM kill, ``systemctl restart``). Its join token
was single-use and its token file is gone; the credential its first join was issued lived in memory only. So a
restarted agent could never join again, and its healthy machine was returned at its join deadline or reported lost
(issue 31 item 7, "agent restarts"). With ``--state-file`` the agent writes what it would present next (the token
before its first accepted join, then its credential or rejoin proof) to that file, 0600, replaced atomically
whenever it changes, and a restarted agent reads it instead of a token.

The file is JSON, at most ``MAX_BYTES``. One that is unreadable, insecure (not a regular 0600 file of this user)
or not of this shape is refused with a ``ConfigError`` naming the file and the problem, never the content. One
written for another machine (``instance_ref`` or ``claim`` not those of the command line) is ignored with a warning:
it is what a reused disk left behind.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs

from provisionerd.agent.token import MAX_TOKEN_CHARS, read_private_file
from provisionerd.domain.errors import ConfigError
from provisionerd.telemetry.files import write_atomic

log = logging.getLogger(__name__)

VERSION = 1
MAX_BYTES = 8192
#: The longest secret kept (a token, a credential, a proof, a bootstrap secret with its prefix).
MAX_SECRET = MAX_TOKEN_CHARS + 64
MAX_NAME = 256


@attrs.frozen
class SavedSecrets:
    """What ``agent.join.Credentials`` needs to go on after a restart. Secrets are never in the ``repr``."""

    instance_ref: str
    claim: str
    token: str | None = attrs.field(repr=False)
    proof: str = attrs.field(repr=False)
    credential: str = attrs.field(default="", repr=False)
    use_proof: bool = False
    maybe_spent: bool = False
    proof_tried: bool = False

    def secrets(self) -> list[str]:
        """Every secret held (for the log redactor)."""
        return [s for s in (self.token, self.proof, self.credential) if s]

    def belongs_to(self, instance_ref: str, claim: str) -> bool:
        """Whether this was written for the machine the command line names (an address-bound agent learns its
        ``instance_ref`` from the controller, so only its claim is compared)."""
        if claim:
            return self.claim == claim
        return not self.claim and self.instance_ref == instance_ref

    def to_json(self) -> bytes:
        return json.dumps({"version": VERSION, **attrs.asdict(self)}, sort_keys=True).encode()


def _text(doc: dict[str, Any], key: str, limit: int, source: str, *, optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise ConfigError(f"{source}: {key!r} must be printable text of at most {limit} characters")
    return value


def parse(data: bytes, source: str) -> SavedSecrets:
    """``SavedSecrets`` from a state file's bytes. Raises ``ConfigError``."""
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{source} is larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError:
        raise ConfigError(f"{source} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ConfigError(f"{source} is not an agent state file of version {VERSION}")
    flags = {k: doc.get(k, False) for k in ("use_proof", "maybe_spent", "proof_tried")}
    if not all(isinstance(v, bool) for v in flags.values()):
        raise ConfigError(f"{source}: use_proof, maybe_spent and proof_tried must be true or false")
    saved = SavedSecrets(
        instance_ref=_text(doc, "instance_ref", MAX_NAME, source),
        claim=_text(doc, "claim", MAX_NAME, source),
        token=_text(doc, "token", MAX_SECRET, source, optional=True),
        proof=_text(doc, "proof", MAX_SECRET, source),
        credential=_text(doc, "credential", MAX_SECRET, source),
        **flags,
    )
    if saved.token is None and not saved.credential and not saved.use_proof:
        raise ConfigError(f"{source} holds no secret to join with")
    return saved


@attrs.frozen
class StateFile:
    """``--state-file``: ``load`` at start, ``save`` whenever what the next join presents changes."""

    path: Path

    @property
    def source(self) -> str:
        return f"agent state file {str(self.path)!r}"

    def load(self, instance_ref: str, claim: str) -> SavedSecrets | None:
        """The saved secrets of this machine; ``None`` when there is no file, or one written for another machine
        (a warning). Raises ``ConfigError`` for a file that cannot be used."""
        if not self.path.exists() and not self.path.is_symlink():
            return None
        saved = parse(read_private_file(self.path, MAX_BYTES, self.source), self.source)
        if not saved.belongs_to(instance_ref, claim):
            log.warning("%s was written for another machine; ignoring it", self.source)
            return None
        return saved

    def save(self, saved: SavedSecrets) -> None:
        """Replace the file atomically (0600, fsync). Raises ``OSError``."""
        write_atomic(self.path, saved.to_json())
