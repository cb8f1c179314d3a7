"""``provisionerd orphans adopt|return --config FILE --provider P --machine ID [--dry-run] [--json]``: act on one
finding explicitly.

Two paths, one decision. The command first asks the **running daemon**, through the admin socket named in the
config (``[daemon] admin_socket``), with ``{"cmd": "orphan_action", ...}``: the daemon decides and acts with its
own session view, lease keeper, mutation gate and executor (``provisionerd.daemon.orphans.OrphanActions``), so
the intent is committed under the daemon's epoch before any provider call, and the audit event goes to the daemon's
events log. Only when no daemon listens (no socket file, or the connection is refused: a stale socket) does the
command act **directly** (``provisionerd.daemon.orphan_direct``): it joins the controller as its own identity
(``<identity>-orphans-admin``), acquires the provider's lease itself, passes a gate and an executor built by the
daemon's own builder (``provisionerd.daemon.builder``: the daemon's settings, from the same config) and gives the
lease back on exit (while someone else holds that lease, the controller refuses it, ``held``, and nothing
changes). Any other failure to reach the daemon (a timeout, a permission error, a reply that is not JSON) ends the
command (exit 1) without acting: the daemon may be running, and the command never acts beside a running daemon.
Both paths call :func:`decide_and_act`.

What the admin's word overrides, and what it does not
------------------------------------------------------
It reads both views and classifies like an orphan pass, with the lease held, then looks up the finding for
``--machine``. The admin *is* the confirmation, so policy blockers are overridden: ``grace``,
``launch_time_unknown``, ``already_reported``, ``rate_cap``, ``breaker_open``, ``dry_run``, ``settling``. Never
overridden: an unreadable view, no lease, a controller that is not the primary, the protect tag, and a machine
that is not a finding at all (untagged or another cluster's, tracked, or not listed). ``adopt`` needs a
``tagged_unknown`` finding (a live host match is used when there is exactly one); ``return`` needs a
``never_joined`` or ``tagged_unknown`` finding that matches no live host (returning a machine a worker runs on is a
drain, not an orphan cleanup). The action is audited as ``orphan_action`` with ``confirmed_by: {"by": "admin",
"user": ..., "identity": ..., "via": "daemon"|"direct"}`` by whoever acts.

``--dry-run`` says what would happen and changes nothing, on both paths: the daemon decides with its lease and
stops before the gate; the direct path reads through a read-only provider client, joins without taking the lease
(so ``no_lease`` is the one blocker it cannot judge) and commits nothing. Exit 0 when the action was done (or would
be), 1 when refused, failed or not finished in time (the daemon carries on; its events log tells the outcome), 2 on
bad arguments or config.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from provisionerd.config.loader import Config, ProviderConfig
from provisionerd.domain.errors import ProtocolError
from provisionerd.domain.model import NO_EPOCH
from provisionerd.execution.orphan_cycle import OrphanExecutor, audit_action, carry_out, observe
from provisionerd.execution.orphan_reads import ControllerReader, LeaseReader
from provisionerd.orphans.classify import classify
from provisionerd.orphans.model import (
    AMBIGUOUS_MATCH,
    LISTING_ABSENT,
    LISTING_UNREADABLE,
    NEVER_JOINED,
    NO_LEASE,
    NOT_PRIMARY,
    PROTECTED,
    TAGGED_UNKNOWN,
    VIEW_UNREADABLE,
    Finding,
    LeaseState,
    PlannedAction,
    evidence_json,
    orphan_op_id,
)
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.provider.client import ProviderReader
from provisionerd.telemetry.events import EventLog

PROG = "provisionerd orphans"
KINDS = ("adopt", "return")
#: Blockers the admin's explicit word never overrides.
HARD_BLOCKERS = frozenset({LISTING_UNREADABLE, LISTING_ABSENT, VIEW_UNREADABLE, NO_LEASE, NOT_PRIMARY, PROTECTED})
#: Added to a provider's own timeouts for the bound of one action through the daemon (see ``action_timeout``).
ACTION_MARGIN = 10.0
MAX_FIELD = 256  # machine ids, provider names and user names from the admin socket


def side_identity(identity: str, role: str) -> str:
    """A command's own controller identity (``<identity>-orphans-<role>``, within the 63-character limit)."""
    suffix = f"-orphans-{role}"
    return identity[: 63 - len(suffix)] + suffix


def policy_of(provider: ProviderConfig, *, dry_run: bool = False) -> OrphanPolicy:
    """The provider's orphan policy (``ConfigError`` if a knob is invalid); ``dry_run`` forces dry run on. The
    daemon's cycles, the admin's decision and the dry-run report all take it from here."""
    policy = OrphanPolicy.from_provider_config(provider)
    return attrs.evolve(policy, dry_run=True) if dry_run else policy


@attrs.frozen
class AdminRequest:
    """What the admin asks: ``kind`` (adopt | return) of ``machine_id`` at ``provider``, by ``user``."""

    kind: str
    provider: str
    machine_id: str
    user: str = ""
    dry_run: bool = False

    @classmethod
    def from_json(cls, document: Any) -> AdminRequest:
        """The request of an ``orphan_action`` admin-socket document; ``ProtocolError`` naming what is wrong."""
        if not isinstance(document, Mapping):
            raise ProtocolError("an orphan_action request must be a JSON object")
        fields: dict[str, str] = {}
        for key, name, required in (
            ("action", "kind", True),
            ("provider", "provider", True),
            ("machine", "machine_id", True),
            ("user", "user", False),
        ):
            value = document.get(key, None if required else "")
            if not isinstance(value, str) or (required and not value) or len(value) > MAX_FIELD:
                raise ProtocolError(
                    f"orphan_action: {key!r} must be a {'non-empty ' if required else ''}string "
                    f"of at most {MAX_FIELD} characters, not {value!r:.80}"
                )
            if not value.isprintable():
                raise ProtocolError(f"orphan_action: {key!r} must be printable, not {value!r:.80}")
            fields[name] = value
        if fields["kind"] not in KINDS:
            raise ProtocolError(f"orphan_action: 'action' must be one of {', '.join(KINDS)}, not {fields['kind']!r}")
        dry_run = document.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ProtocolError(f"orphan_action: 'dry_run' must be true or false, not {dry_run!r:.80}")
        return cls(dry_run=dry_run, **fields)

    def to_json(self) -> dict[str, Any]:
        return {
            "cmd": "orphan_action",
            "action": self.kind,
            "provider": self.provider,
            "machine": self.machine_id,
            "user": self.user,
            "dry_run": self.dry_run,
        }


@attrs.frozen
class AdminResult:
    """``ok``: done (or, in a dry run, would be done). ``outcome``: ok | failed | busy | refused (the gate) |
    would (dry run) | "" (not attempted: see ``message``). ``answer``: the provider's or controller's answer."""

    ok: bool
    message: str
    answer: Any = None
    op_id: str = ""
    orphan_class: str = ""
    outcome: str = ""
    via: str = ""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, document: Any) -> AdminResult:
        """A result the daemon sent; ``ValueError`` when it is not one."""
        if not isinstance(document, Mapping) or not isinstance(document.get("ok"), bool):
            raise ValueError("the daemon's result is not an orphan action result")
        names = {field.name for field in attrs.fields(cls)}
        return cls(**{key: value for key, value in document.items() if key in names})


def check(
    kind: str, finding: Finding | None, machine_id: str, protect_tag: str, *, lease_assumed: bool = False
) -> str | None:
    """Why ``kind`` may not be done to ``finding`` (``None`` when it may). ``lease_assumed``: the caller holds no
    lease on purpose (the direct path's dry run) and would take it first, so ``no_lease`` is not counted.

    Protection is read from the machine's tags, not from ``blocked_by``: the finding's own action may be one the
    protect tag does not stop (``report``), while the admin asks for one it does."""
    if finding is None:
        return (
            f"machine {machine_id!r} is not an orphan finding: it is not listed with this cluster's and this "
            "provider's tags, or a live fact explains it"
        )
    blockers = set(finding.blocked_by)
    tags = finding.evidence.get("tags") or {}
    if protect_tag in tags:
        blockers.add(PROTECTED)
    if lease_assumed:
        blockers.discard(NO_LEASE)
    hard = sorted(HARD_BLOCKERS.intersection(blockers))
    if hard:
        return f"blocked by {', '.join(hard)}"
    if kind == "adopt":
        if finding.orphan_class != TAGGED_UNKNOWN:
            return f"only a tagged_unknown machine can be adopted; this is {finding.orphan_class}"
        if AMBIGUOUS_MATCH in finding.blocked_by:
            return "several live hosts match it: adopting one would be a guess"
    elif finding.orphan_class not in (NEVER_JOINED, TAGGED_UNKNOWN):
        return f"only a never_joined or tagged_unknown machine can be returned; this is {finding.orphan_class}"
    elif finding.action == "adopt":
        return "it matches a live host: adopt it, or drain the host, instead of returning it"
    return None


def admin_action(kind: str, finding: Finding, lease: LeaseState) -> PlannedAction:
    """The action the admin confirmed, named by the finding's own orphan op_id (a retry reuses it)."""
    host = finding.evidence.get("matching_host") or {}
    return PlannedAction(
        kind=kind,
        orphan_class=finding.orphan_class,
        provider=finding.provider,
        machine_id=finding.machine_id,
        op_id=orphan_op_id(finding.provider, finding.orphan_class, finding.machine_id, kind),
        epoch=lease.epoch if lease.epoch is not None else NO_EPOCH,
        machine_name=finding.evidence.get("name") or "",
        instance_ref=host.get("instance_ref") or finding.evidence.get("instance_ref") or finding.machine_id,
        hostname=host.get("hostname") or finding.evidence.get("name") or "",
        address=host.get("address") or finding.evidence.get("address") or "",
        evidence_json=evidence_json(finding.evidence),
    )


@attrs.frozen
class Actor:
    """Who decides and acts, with what: the daemon's own pieces (``via="daemon"``) or the command's own session,
    lease and executor (``via="direct"``), both built by ``provisionerd.daemon.builder`` (``Pieces.actor``).
    ``executor`` is ``None`` for a direct dry run (it never acts).
    ``witness`` is added to the audit's ``confirmed_by`` (e.g. the socket peer's ``uid``)."""

    identity: str
    via: str
    client: ProviderReader
    read_controller: ControllerReader
    read_lease: LeaseReader
    executor: OrphanExecutor | None
    events: EventLog
    wall_clock: Callable[[], float] = time.time
    witness: Mapping[str, Any] = attrs.field(factory=dict)


async def decide_and_act(
    config: Config, request: AdminRequest, actor: Actor, *, lease_assumed: bool = False
) -> AdminResult:
    """The one decision both paths run: observe (listing, then view and lease), classify, find the machine's
    finding, ``check`` it, then carry the action out through the actor's executor and audit it (or, in a dry run,
    say what would be done). Never raises for a refusal or a failure: see ``ok``."""
    provider = config.provider(request.provider)
    obs = await observe(
        config.cluster,
        request.provider,
        actor.client,
        actor.read_controller,
        actor.read_lease,
        wall_clock=actor.wall_clock,
        list_timeout=provider.timeouts.for_action("listMachines"),
        expected=provider.max_machines,
    )
    policy = policy_of(provider)
    result = classify(obs, policy)
    finding = next(
        (f for f in result.findings if f.machine_id == request.machine_id and f.orphan_class != "license"), None
    )
    refusal = check(request.kind, finding, request.machine_id, policy.protect_tag, lease_assumed=lease_assumed)
    what = f"{request.kind} {request.machine_id}"
    if refusal is not None or finding is None:
        return AdminResult(
            False,
            f"{what}: refused: {refusal}",
            via=actor.via,
            orphan_class="" if finding is None else finding.orphan_class,
        )
    action = admin_action(request.kind, finding, obs.lease)
    if request.dry_run or actor.executor is None:
        lease_note = "; the lease would be taken first" if lease_assumed else ""
        overriding = [b for b in finding.blocked_by if not (lease_assumed and b == NO_LEASE)]
        return AdminResult(
            True,
            f"{what}: would {request.kind} it (op_id {action.op_id}, overriding "
            f"{', '.join(overriding) or 'nothing'}){lease_note}; dry run: nothing changed",
            op_id=action.op_id,
            orphan_class=finding.orphan_class,
            outcome="would",
            via=actor.via,
        )
    record = await carry_out(actor.executor, action, reason=f"admin: orphan {finding.orphan_class}: {request.kind}")
    confirmed_by = {
        "by": "admin",
        "user": request.user,
        "identity": actor.identity,
        "via": actor.via,
        **actor.witness,
        "overridden": list(finding.blocked_by),
    }
    audit_action(actor.events, action, record, confirmed_by)
    return AdminResult(
        record.outcome == "ok",
        f"{what}: {record.outcome} (by {actor.identity})",
        record.answer,
        action.op_id,
        finding.orphan_class,
        record.outcome,
        actor.via,
    )


def action_timeout(config: Config, provider: str) -> float:
    """How long one action through the daemon may take before the socket answers ``pending``: the listing, the
    return call and one status poll at the provider's own timeouts, two controller round trips (the intent, the
    result), and ``ACTION_MARGIN``. The action itself is not cut short: the daemon finishes it and audits it."""
    timeouts = config.provider(provider).timeouts
    calls = sum(timeouts.for_action(a) for a in ("listMachines", "requestReturnMachines", "getRequestStatus"))
    return calls + 2 * config.controller.request_timeout + ACTION_MARGIN


def current_user() -> str:
    """The login name of whoever runs the command (for the audit; "" when it cannot be told)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""
