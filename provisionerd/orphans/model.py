"""The orphan classifier's inputs, memory and outputs: frozen values, no logic beyond small helpers.

See :mod:`provisionerd.orphans.classify` for the contract of the classifier itself. The blocker names below are
the stable vocabulary of ``Finding.blocked_by`` (they appear in the admin report and its JSON); they are listed in
the canonical order in which a finding reports them.
"""

from __future__ import annotations

import hashlib
import json
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from provisionerd.domain.model import (
    NO_EPOCH,
    Epoch,
    Fact,
    HostState,
    ListedMachine,
    Lost,
    OrphanAdopted,
    OrphanReported,
    ReturnIntent,
)
from provisionerd.planner.fact_view import FactView

# --- vocabulary ------------------------------------------------------------------------------------------------

NEVER_JOINED = "never_joined"
TAGGED_UNKNOWN = "tagged_unknown"
GHOST = "ghost"
LICENSE = "license"
ORPHAN_CLASSES = (NEVER_JOINED, TAGGED_UNKNOWN, GHOST, LICENSE)

#: Actions a finding can name. ``return``/``stop``/``terminate`` call the provider; ``adopt``/``retire``/``report``
#: only commit a fact (OrphanAdopted / Lost / OrphanReported); ``none`` means nothing is left to do.
ACTIONS = ("return", "stop", "terminate", "adopt", "retire", "report", "none")
#: The actions the rate cap counts.
CLEANUP_ACTIONS = frozenset({"return", "stop", "terminate", "retire"})
#: The actions the circuit breaker stops (everything automatic that changes what we track or what exists).
BREAKER_ACTIONS = CLEANUP_ACTIONS | {"adopt"}
#: The actions a protect tag stops (they touch the machine or make it ours to return later).
PROTECTED_ACTIONS = frozenset({"return", "stop", "terminate", "adopt"})

LISTING_UNREADABLE = "listing_unreadable"  # the provider's listMachines failed this cycle
LISTING_ABSENT = "listing_absent"  # the provider has no listMachines at all (a legacy LSF plugin)
VIEW_UNREADABLE = "view_unreadable"  # the controller's facts/hosts could not be read this cycle
NO_LEASE = "no_lease"  # no lease held, or no epoch to stamp on the action
NOT_PRIMARY = "not_primary"  # the controller we read is not the primary
SETTLING = "settling"  # the settle window after a failover has not passed
PROTECTED = "protected"  # the machine carries the protect tag
LAUNCH_TIME_UNKNOWN = "launch_time_unknown"  # no usable cloud launch time, so its age cannot be proved
GRACE = "grace"  # younger than orphan_grace (measured from the cloud launch time)
GHOST_UNCONFIRMED = "ghost_unconfirmed"  # missed by fewer than ghost_confirmations (2) consecutive listings
HOST_ALIVE = "host_alive"  # a ghost whose host the controller still sees alive: the listing is suspect
AMBIGUOUS_MATCH = "ambiguous_match"  # several live hosts match: adopting one would be a guess
ALREADY_REPORTED = "already_reported"  # an OrphanReported fact for this machine and class exists
BREAKER_OPEN = "breaker_open"  # the circuit breaker is open (failed cleanups or too many orphans at once)
RATE_CAP = "rate_cap"  # max_cleanup_per_interval reached this pass
DRY_RUN = "dry_run"  # policy.dry_run: nothing is acted on
BLOCKERS = (
    LISTING_UNREADABLE,
    LISTING_ABSENT,
    VIEW_UNREADABLE,
    NO_LEASE,
    NOT_PRIMARY,
    SETTLING,
    PROTECTED,
    LAUNCH_TIME_UNKNOWN,
    GRACE,
    GHOST_UNCONFIRMED,
    HOST_ALIVE,
    AMBIGUOUS_MATCH,
    ALREADY_REPORTED,
    BREAKER_OPEN,
    RATE_CAP,
    DRY_RUN,
)
_BLOCKER_RANK = {name: rank for rank, name in enumerate(BLOCKERS)}


def ordered_blockers(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` without duplicates, in the canonical order of :data:`BLOCKERS`."""
    return tuple(sorted(set(names), key=_BLOCKER_RANK.__getitem__))


def freeze(value: Any) -> Any:
    """A deep read-only copy of JSON-shaped data: mappings become mapping proxies, lists become tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze`: plain dicts and lists, ready for ``json.dumps``."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


# --- inputs ----------------------------------------------------------------------------------------------------


@attrs.frozen
class Unreadable:
    """Marker for a view that could not be read this cycle. ``reason`` is for humans and must hold no secrets."""

    reason: str = ""


@attrs.frozen
class ListingAbsent(Unreadable):
    """Marker for a provider that cannot list at all (no ``listMachines``: a legacy LSF plugin). It is never
    read, so it is not *unreadable*; but nothing that rests on a listing may happen, so the classifier treats it
    like one (the pass is narrowed, every action blocked by ``listing_absent``). ``invisible``: the orphan classes
    nothing can reveal for this provider (``provider.legacy.rules.invisible_classes``)."""

    invisible: tuple[str, ...] = ()


@attrs.frozen
class LeaseState:
    """This daemon's lease on the provider as the lease layer sees it *now* (on its own clock)."""

    held: bool = False
    epoch: Epoch | None = None

    @property
    def usable(self) -> bool:
        return self.held and self.epoch is not None and self.epoch != NO_EPOCH


@attrs.frozen
class ControllerState:
    """What the session knows of the controller. ``settled`` is computed by the session on its monotonic clock:
    the controller is primary, its own-term NOOP is committed and the settle window after the last failover has
    passed (workers had their chance to rejoin)."""

    primary: bool = False
    settled: bool = False


def _nonnegative(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an integer >= 0, not {value!r}")


def _count_or_unknown(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None:
        _nonnegative(instance, attribute, value)


def _epoch_seconds(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be epoch seconds >= 0 (0: unknown), not {value!r}")


@attrs.frozen
class CountedResource:
    """One counted grant held from a provider (a licence pool), class ``license``.

    ``granted``: how many units the licence source says are checked out to this cluster; ``in_use``: how many the
    controller counts as in use by jobs (``None``: the controller does not say, which is never read as 0);
    ``provider_agrees``: the licence source confirms the grant may be returned now (its own count of use is 0);
    ``provider_in_use``: that count, for the evidence (``None``: not given); ``checked_out``: epoch seconds when the
    oldest unit still granted was checked out (0: unknown), the clock ``orphan_grace`` is measured on.

    A finding exists when more units are granted than anyone uses (``granted > in_use``, or ``granted >
    provider_in_use`` while the controller does not say). It is returned automatically only when ``in_use == 0``
    (known), ``provider_agrees`` and the grant is older than ``orphan_grace``; otherwise it is reported for an admin.
    """

    resource: str
    granted: int = attrs.field(validator=_nonnegative)
    in_use: int | None = attrs.field(validator=_count_or_unknown)
    provider_agrees: bool = False
    provider_in_use: int | None = attrs.field(default=None, validator=_count_or_unknown)
    checked_out: float = attrs.field(default=0.0, validator=_epoch_seconds)

    @property
    def used(self) -> int:
        """The units someone says are in use: the controller's count, else the licence source's (else 0)."""
        if self.in_use is not None:
            return self.in_use
        return self.provider_in_use or 0

    @property
    def returnable(self) -> bool:
        """Whether nothing holds the grant by every count that exists (grace aside): the one case it may go back."""
        return self.in_use == 0 and self.provider_agrees and self.granted > 0 and not self.provider_in_use


# Typed converters for the sequence fields: mypy's attrs plugin cannot solve ``converter=tuple``'s type variable.
def _host_states(items: Iterable[HostState]) -> tuple[HostState, ...]:
    return tuple(items)


def _licenses(items: Iterable[CountedResource]) -> tuple[CountedResource, ...]:
    return tuple(items)


def _ids(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _listing(value: Any) -> Any:
    return value if isinstance(value, Unreadable) else tuple(value)


def _finite(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be finite epoch seconds, not {value!r}")


@attrs.frozen
class Observation:
    """Everything one classification pass looks at, for one provider.

    Read the provider's listing *before* the controller's view: an intent is committed before its machines are
    created, so every machine in an earlier listing has its intent in a later view, and a create racing the pass
    can never look like an unknown machine. (The opposite race, a fact newer than the listing, can only look like
    a ghost's first miss, which the two-reads rule absorbs.)
    """

    cluster_id: str
    provider: str
    now: float = attrs.field(validator=_finite)  # wall-clock epoch seconds, the clock of cloud launch times
    listing: tuple[ListedMachine, ...] | Unreadable = attrs.field(converter=_listing)
    view: FactView | Unreadable
    hosts: tuple[HostState, ...] = attrs.field(default=(), converter=_host_states)  # ignored when view is unreadable
    licenses: tuple[CountedResource, ...] = attrs.field(default=(), converter=_licenses)
    lease: LeaseState = LeaseState()
    controller: ControllerState = ControllerState()
    #: Ids of listed machines sifted out while the listing was read (``orphans.sift``): listed, cleared, and not in
    #: ``listing`` unless another copy of the id is. Read only with a readable listing.
    cleared: frozenset[str] = attrs.field(default=frozenset(), converter=_ids)

    @property
    def listed_count(self) -> int:
        """Machines this listing showed, cleared ones included (0 when it is unreadable)."""
        return len(self.listing) + len(self.cleared) if isinstance(self.listing, tuple) else 0


# --- memory ----------------------------------------------------------------------------------------------------


@attrs.frozen
class ClassifierMemory:
    """What the classifier carries from one pass to the next (per provider; lost on restart, which is safe:
    a ghost then needs two fresh misses and the breaker starts closed).

    ``ghost_misses``: machine id -> consecutive listings that did not show a live fact's machine. Only ids still
    missing are kept, so it is bounded by the number of facts. ``failed_cleanups``: consecutive failed cleanups;
    the daemon reports each provider answer with :meth:`after_cleanup`.
    """

    ghost_misses: Mapping[str, int] = attrs.field(factory=dict, converter=freeze, hash=False)
    failed_cleanups: int = attrs.field(default=0, validator=_nonnegative)

    def after_cleanup(self, ok: bool) -> ClassifierMemory:
        """The memory after one cleanup's provider answer: a failure counts, a success closes the count."""
        return attrs.evolve(self, failed_cleanups=0 if ok else self.failed_cleanups + 1)

    def reset_breaker(self) -> ClassifierMemory:
        """What an admin's explicit reset does."""
        return attrs.evolve(self, failed_cleanups=0)


# --- outputs ---------------------------------------------------------------------------------------------------


@attrs.frozen
class Finding:
    """One thing that looks orphaned, what would be done about it, and every precondition that blocks that.

    ``machine_id`` is the resource name for class ``license``. ``evidence`` is JSON-shaped and read-only (tags,
    launch_time, age, epoch, matching_host, and per class op_id, not_found_reads, granted/in_use...).
    ``blocked_by`` is empty exactly when the action is allowed this pass; it is in :data:`BLOCKERS` order.
    """

    orphan_class: str
    provider: str
    machine_id: str
    evidence: Mapping[str, Any] = attrs.field(converter=freeze, hash=False)
    action: str
    blocked_by: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.blocked_by and self.action != "none"


def orphan_op_id(provider: str, orphan_class: str, machine_id: str, action: str) -> str:
    """A stable idempotency key: the same finding acted on again (a retry, a new lease epoch) reuses it."""
    digest = hashlib.sha256("\0".join((provider, orphan_class, machine_id, action)).encode()).hexdigest()
    return f"orphan-{digest[:24]}"


@attrs.frozen
class PlannedAction:
    """An action every precondition allowed, with what the daemon needs to carry it out."""

    kind: str
    orphan_class: str
    provider: str
    machine_id: str
    op_id: str
    epoch: Epoch
    machine_name: str = ""
    instance_ref: str = ""
    hostname: str = ""
    address: str = ""
    evidence_json: str = "{}"
    units: int = 0  # licence units a ``license`` return checks in (the grant's ``granted``); 0 for machines

    def fact(self) -> Fact:
        """The fact to commit (and have acknowledged) *before* the provider call, or as the whole action.

        ``return``/``stop``/``terminate`` -> ``ReturnIntent``; ``adopt`` -> ``OrphanAdopted``; ``retire`` ->
        ``Lost``; ``report`` -> ``OrphanReported``. A licence return is recorded as an ``OrphanReported`` of class
        ``license`` whose evidence holds the units and the op_id (never a ``ReturnIntent``: recovery would resume
        that as a return of a *machine* named like the pool).
        """
        reason = f"orphan {self.orphan_class}: {self.kind}"
        if self.orphan_class == LICENSE and self.kind == "return":
            return OrphanReported(
                self.provider, self.epoch, self.op_id, self.machine_id, self.orphan_class, self.evidence_json
            )
        if self.kind in ("return", "stop", "terminate"):
            return ReturnIntent(self.provider, self.epoch, self.op_id, (self.machine_id,), reason)
        if self.kind == "adopt":
            return OrphanAdopted(
                self.provider, self.epoch, self.op_id, self.machine_id, self.instance_ref, self.hostname, self.address
            )
        if self.kind == "retire":
            reason = "ghost: not found in consecutive listings"
            return Lost(self.provider, self.epoch, self.op_id, self.machine_id, reason)
        if self.kind == "report":
            return OrphanReported(
                self.provider, self.epoch, self.op_id, self.machine_id, self.orphan_class, self.evidence_json
            )
        raise ValueError(f"action {self.kind!r} has no fact")


def evidence_json(evidence: Mapping[str, Any]) -> str:
    return json.dumps(thaw(evidence), sort_keys=True, separators=(",", ":"))


@attrs.frozen
class BreakerState:
    """Whether the circuit breaker is open this pass, and why (``failed_cleanups`` / ``orphan_share``)."""

    open: bool = False
    reasons: tuple[str, ...] = ()
    suspects: int = 0
    known: int = 0


@attrs.frozen
class Classification:
    """The result of one pass: every finding (sorted by class then machine id), the memory for the next pass,
    the actions allowed now (a subset of the findings with no blocker, in the same order), the breaker's state,
    and ``skipped``: the unreadable views that made this pass act on nothing (empty on a normal pass)."""

    findings: tuple[Finding, ...]
    memory: ClassifierMemory
    allowed: tuple[PlannedAction, ...]
    breaker: BreakerState
    skipped: tuple[str, ...] = ()


Listing = tuple[ListedMachine, ...] | Unreadable
