"""The worker's join as plain decisions: what a controller's answer means, which secret to present, how long to wait.

No I/O and no clock here: ``agent.py`` runs these against real connections on trio's clock.
"""

from __future__ import annotations

import random

import attrs

from provisionerd.agent.saved import SavedSecrets
from provisionerd.agent.token import BOOTSTRAP_PREFIX, rejoin_credential
from provisionerd.domain.errors import AuthError, LinkDown
from provisionerd.domain.model import PROTOCOL_VERSION
from provisionerd.wire.messages import ErrorMsg, JoinReply, Message

#: Exit codes of ``provisionerd agent``.
EXIT_STOPPED = 0  # returned (SIGTERM/SIGINT): a clean stop
EXIT_USAGE = 2  # bad arguments or configuration (a token file readable by others, say)
EXIT_TOKEN_REFUSED = 3  # the controller refused this worker's secret until ``--orphan-timeout`` passed
EXIT_REFUSED = 4  # refused for good: protocol version, role
EXIT_ORPHANED = 5  # no controller reached for ``--orphan-timeout`` seconds: nothing controls this machine any more

#: The refusals no retry can change (a config of this agent): it stops at once. Any other refusal (the token or
#: credential refused, the primary refusing now) may be "not yet": the machine's fact is not committed, the
#: controller restarted or lost its store and an admin has not decided. The agent keeps its secret and tries again.
FINAL_REFUSALS = frozenset({"version_mismatch", "not_allowed"})
#: The back-off between joins refused "not yet": doubling from ``REFUSED_FIRST`` to ``REFUSED_MAX`` seconds (a
#: thousand refused machines cost the controller a few joins a second, not a storm).
REFUSED_FIRST = 1.0
REFUSED_MAX = 60.0


class JoinRefused(AuthError):
    """The controller refused this worker for good (``FINAL_REFUSALS``). ``exit_code`` is what ``provisionerd
    agent`` exits with."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.exit_code = EXIT_REFUSED
        super().__init__(f"join refused ({code}): {message}")


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """``initial * 2**attempt`` capped at ``maximum``, scaled by a factor in ``[0.5, 1]`` (so agents that lost
    the same controller at once do not reconnect in lockstep)."""
    return min(maximum, initial * 2.0 ** min(attempt, 32)) * (1.0 - 0.5 * rng.random())


class Orphaned(LinkDown):
    """No controller was reached for ``silence`` seconds (at least the agent's ``orphan_timeout``): the machine
    is presumably forgotten (its daemon and controllers gone, its fact lost), so the agent stops instead of
    keeping an unmanaged machine alive. ``exit_code`` is what ``provisionerd agent`` exits with."""

    def __init__(self, silence: float, refused: str = "") -> None:
        """``refused``: the last join was refused with this (exit code 3: the secret was refused until the
        timeout), rather than no controller answering (5)."""
        self.silence = silence
        self.refused = refused
        self.exit_code = EXIT_TOKEN_REFUSED if refused else EXIT_ORPHANED
        why = f"joins refused ({refused})" if refused else "no controller reached"
        super().__init__(f"{why} for {silence:.1f} s")


@attrs.frozen
class Joined:
    term: int
    controller_id: str
    #: The instance's own credential when this join spent the token ("" when it presented the credential already).
    credential: str = attrs.field(default="", repr=False)
    #: An address-bound join's answer: the instance the controller paired the claimed machine with.
    instance_ref: str = ""


@attrs.frozen
class Redirect:
    address: str


@attrs.frozen
class Elsewhere:
    """Not now, not here: try the next address after a backoff."""

    reason: str


@attrs.frozen
class Refused:
    code: str
    message: str


JoinOutcome = Joined | Redirect | Elsewhere | Refused


def judge_join_reply(msg: Message | None) -> JoinOutcome:
    """What the first frame the controller sent back means for a worker."""
    match msg:
        case JoinReply(accepted=True, protocol_version=version) if version != PROTOCOL_VERSION:
            return Refused("version_mismatch", f"controller speaks {version}, we speak {PROTOCOL_VERSION}")
        case JoinReply(accepted=True, term=term, controller_id=controller_id, credential=credential) as reply:
            return Joined(term, controller_id, credential, reply.instance_ref)
        case JoinReply(primary=False, redirect=redirect) if redirect:
            return Redirect(redirect)
        case JoinReply(primary=False, reason=reason):
            return Elsewhere(f"standby without a redirect ({reason or 'no reason given'})")
        case JoinReply(reason=reason):
            return Refused("refused", reason or "the primary refused the join")
        case ErrorMsg(code=code, message=message) if code in ("token_invalid", "version_mismatch", "not_allowed"):
            return Refused(code, message)
        case ErrorMsg(code=code, message=message):
            return Elsewhere(f"controller error {code}: {message}")
        case None:
            return Elsewhere("the controller closed the connection during the join")
        case _:
            return Elsewhere(f"unexpected answer to Join: {type(msg).__name__}")


@attrs.define
class Credentials:
    """Which secret the next ``Join`` carries: the token until a join is accepted, then the instance's own
    credential from that reply (``JoinReply.credential``), or, from a controller that issues none, the rejoin proof
    derived from the token. The raw token is forgotten once a join has been accepted; the credential is never
    logged, and kept on disk only with ``--state-file`` (``snapshot``/``restore``: ``agent.saved``)."""

    instance_ref: str
    _token: str | None = attrs.field(repr=False)
    #: The address-bound join: the machine id claimed (``instance_ref`` is then "" until the controller names it,
    #: and the token is the cluster's bootstrap secret).
    claim: str = ""
    _proof: str = attrs.field(init=False, repr=False)
    _credential: str = attrs.field(default="", init=False, repr=False)
    use_proof: bool = False
    maybe_spent: bool = False  # a Join with the raw token went out and no answer came back
    proof_tried: bool = False

    def __attrs_post_init__(self) -> None:
        assert self._token is not None
        self._proof = rejoin_credential(self._token, self.instance_ref)

    @classmethod
    def restore(cls, saved: SavedSecrets) -> Credentials:
        """The credentials a previous run of this agent saved (``snapshot``)."""
        restored = cls(saved.instance_ref, saved.token or "-", claim=saved.claim)
        restored._token, restored._proof, restored._credential = saved.token, saved.proof, saved.credential
        restored.use_proof, restored.maybe_spent, restored.proof_tried = (
            saved.use_proof,
            saved.maybe_spent,
            saved.proof_tried,
        )
        return restored

    def snapshot(self) -> SavedSecrets:
        """What a restarted agent needs to present the same secret next."""
        return SavedSecrets(
            self.instance_ref,
            self.claim,
            self._token,
            self._proof,
            self._credential,
            self.use_proof,
            self.maybe_spent,
            self.proof_tried,
        )

    @property
    def has_credential(self) -> bool:
        return bool(self._credential)

    def current(self) -> str:
        if self._credential:
            return self._credential
        if self.claim:
            assert self._token is not None
            return BOOTSTRAP_PREFIX + self._token
        if self.use_proof:
            self.proof_tried = True
            return self._proof
        assert self._token is not None
        return self._token

    def sent_without_answer(self) -> None:
        if not self.use_proof and not self._credential:
            self.maybe_spent = True

    def accepted(self, credential: str = "", instance_ref: str = "") -> None:
        """A join was accepted; ``credential``: the one its reply issued (kept for every later join);
        ``instance_ref``: the instance an address-bound join was paired with."""
        self.use_proof, self._token = True, None
        if credential:
            self._credential = credential
        if instance_ref and not self.instance_ref:
            self.instance_ref = instance_ref

    def machine_claim(self) -> str:
        """What the next Join puts in ``machineId``: the claim until the controller paired it with an instance."""
        return self.claim if not self.instance_ref else ""

    def refused(self) -> bool:
        """The secret presented was refused; it is kept either way. True: try the proof now (the token may have
        been spent by a join whose answer was lost); False: back off and present the same secret again, except that
        a refused proof while the token is still held goes back to the token (the refusal may have been "not
        yet")."""
        if self._credential or self.claim:
            return False
        if not self.use_proof and self.maybe_spent and not self.proof_tried:
            self.use_proof = True
            return True
        if self.use_proof and self._token is not None:
            self.use_proof = False
        return False
