"""What a legacy LSF plugin cannot promise, and the pure decisions the daemon takes instead.

A legacy plugin is one written to IBM LSF's five-script resource-connector contract alone: no ``op_id``
idempotency, no ``listMachines``, no owner tags, no per-machine bootstrap. Everything here is pure (no I/O, no
trio): the adapter (:mod:`provisionerd.provider.legacy.adapter`), the conformance kit and the daemon's lifecycle call
these functions with plain documents and get decisions back.

- ``lacking_guarantees`` / ``invisible_classes``: what is lost, for the kit and the orphan report.
- ``after_request_error``: what to do after a failed ``requestMachines`` (never a blind retry on a legacy plugin).
- ``fulfilment``: how many machines a finished request really gave, so a "success" with fewer machines than asked
  is re-planned.
- ``return_verdicts``: a return that claims success checked against the machine's own create request.
- ``UserDataTemplate``: the operator's channel for the join token (the only one a legacy plugin has).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from provisionerd.config.user_data import UserDataTemplate as UserDataTemplate  # moved to config; re-exported
from provisionerd.domain.errors import ProviderError, ProviderOutcomeUnknown, ProviderRejected
from provisionerd.orphans.model import GHOST, TAGGED_UNKNOWN

#: The five LSF resource-connector actions: all a legacy plugin has.
LSF_ACTIONS = (
    "getAvailableTemplates",
    "requestMachines",
    "requestReturnMachines",
    "getRequestStatus",
    "getReturnRequests",
)
#: The features a legacy plugin really has (what the adapter's ``describeProvider`` answers).
LEGACY_FEATURES: Mapping[str, bool] = {
    "idempotentRequest": False,
    "listMachines": False,
    "stopMachines": False,
    "tags": False,
    "priceQuotes": False,
    "allOrNothing": False,
}
#: Machine statuses (the provider's own word) that mean the machine no longer runs.
GONE_STATUSES = frozenset({"terminated", "terminating", "shutting-down", "stopped", "stopping", "deleted", "gone"})


@attrs.frozen
class Guarantee:
    """One promise of our contract a plugin does not make: what is lost, and what the daemon does about it."""

    name: str
    lost: str
    instead: str


_BY_FEATURE = (
    (
        "idempotentRequest",
        Guarantee(
            "idempotent requestMachines (op_id)",
            "a requestMachines whose outcome is unknown (timeout, crash, daemon death mid-call) cannot be retried "
            "safely: a retry may create the machines twice",
            "never retried; a requestId the plugin printed is polled and the count it gives reconciled; with no "
            "requestId the outcome stays unknown and is reported",
        ),
    ),
    (
        "listMachines",
        Guarantee(
            "listMachines",
            "machines no fact explains cannot be found (tagged_unknown orphans are invisible); a vanished machine "
            "shows only through its request's status or getReturnRequests",
            "the orphan report names these classes as invisible for this provider instead of claiming none",
        ),
    ),
    (
        "tags",
        Guarantee(
            "owner tags",
            "machines carry no provisionerd tags: ownership rests on the requestIds the adapter recorded",
            "only machines seen in the adapter's own requests are ever returned",
        ),
    ),
    (
        "allOrNothing",
        Guarantee(
            "all-or-nothing requests",
            "a request cannot ask for every machine or none: a demand item that needs all N (an MPI job) cannot "
            "be served by this provider",
            "the planner never sends it such an item; the item's unmet_demand note and provisionerd explain name "
            "the missing feature",
        ),
    ),
)
_LEGACY_ONLY = (
    Guarantee(
        "per-machine bootstrap",
        "no bootstrap (instanceRef, controllers, join token) reaches the machine through the contract",
        "the operator's userData template is rendered into userData; with {join_token} or {instance_ref} the "
        "adapter asks for one machine per requestMachines so each token stays single-use",
    ),
    Guarantee(
        "verified returns",
        "a return's success is the plugin's word",
        "checked against the machine's create request in the same status poll; a machine still running fails "
        "the return, which is then planned again",
    ),
)


def lacking_guarantees(features: Mapping[str, bool], *, legacy: bool) -> tuple[Guarantee, ...]:
    """The guarantees a plugin with ``features`` (``describeProvider``'s booleans; absent = false) lacks."""
    lacking = tuple(g for feature, g in _BY_FEATURE if not features.get(feature, False))
    return lacking + (_LEGACY_ONLY if legacy else ())


def invisible_classes(features: Mapping[str, bool]) -> tuple[str, ...]:
    """Orphan classes the scan cannot see for a plugin with ``features``: without a listing nothing reveals a
    machine no fact explains (``tagged_unknown``) nor proves a recorded one gone (``ghost``). ``never_joined``
    (from the facts) and ``license`` stay visible. A plugin that lists but does not tag cannot tell its machines
    from anyone else's, which hides ``tagged_unknown`` too."""
    if not features.get("listMachines", False):
        return (TAGGED_UNKNOWN, GHOST)
    if not features.get("tags", False):
        return (TAGGED_UNKNOWN,)
    return ()


# --- after a failed requestMachines ---------------------------------------------------------------------------------


class NextStep(enum.Enum):
    RETRY_SAME_OP = "retry_same_op"  # outcome unknown, the plugin is idempotent: check the listing, retry the op_id
    RETRY_LATER = "retry_later"  # refused with a retryable code: nothing happened, a later attempt is safe
    FAILED = "failed"  # refused for good: record RequestFailed; the planner looks elsewhere
    UNKNOWN_OUTCOME = "unknown_outcome"  # legacy: never retry; record it, report its machines as invisible


def after_request_error(error: ProviderError, features: Mapping[str, bool]) -> NextStep:
    """The next step after ``requestMachines`` raised ``error`` on a plugin with ``features``."""
    if isinstance(error, ProviderOutcomeUnknown):
        return NextStep.UNKNOWN_OUTCOME
    if not error.outcome_unknown:
        if isinstance(error, ProviderRejected) and error.retryable:
            return NextStep.RETRY_LATER
        return NextStep.FAILED
    if features.get("idempotentRequest", False) and features.get("listMachines", False):
        return NextStep.RETRY_SAME_OP
    return NextStep.UNKNOWN_OUTCOME


# --- fulfilment of a finished request -------------------------------------------------------------------------------


@attrs.frozen
class Fulfilment:
    """What a create request gave. ``finished``: the request left ``running``. ``shortfall``: machines asked for
    and not delivered (to re-plan), counted only once finished. ``claimed_complete``: the plugin said ``complete``
    (a shortfall under that claim is the silent partial fulfilment LSF plugins are prone to)."""

    asked: int
    finished: bool
    succeeded: tuple[str, ...]
    failed: tuple[str, ...]
    pending: tuple[str, ...]
    claimed_complete: bool

    @property
    def shortfall(self) -> int:
        return max(0, self.asked - len(self.succeeded)) if self.finished else 0

    @property
    def silent_partial(self) -> bool:
        return self.claimed_complete and self.shortfall > 0


def fulfilment(asked: int, entry: Mapping[str, Any]) -> Fulfilment:
    """Count a ``getRequestStatus`` entry of a create request for ``asked`` machines."""
    machines = entry.get("machines") or []
    by_result: dict[str, list[str]] = {"succeed": [], "fail": [], "executing": []}
    for m in machines:
        if m.get("result") == "succeed" and str(m.get("status", "")).lower() in GONE_STATUSES:
            by_result["fail"].append(m["machineId"])  # "succeeded" into a terminated machine gives nothing
        else:
            by_result.get(m.get("result", ""), by_result["executing"]).append(m["machineId"])
    status = entry.get("status")
    return Fulfilment(
        asked=asked,
        finished=status in ("complete", "complete_with_error"),
        succeeded=tuple(by_result["succeed"]),
        failed=tuple(by_result["fail"]),
        pending=tuple(by_result["executing"]),
        claimed_complete=status == "complete",
    )


# --- verifying returns ----------------------------------------------------------------------------------------------


class ReturnVerdict(enum.Enum):
    CONFIRMED = "confirmed"  # the create request shows the machine gone (or no longer lists it)
    STILL_RUNNING = "still_running"  # the plugin said "succeed" but the machine still runs
    UNVERIFIABLE = "unverifiable"  # no create request known for it: the plugin's word is all there is
    NOT_CLAIMED = "not_claimed"  # the return itself did not claim success (yet)


def machine_alive(machine: Mapping[str, Any] | None) -> bool:
    """Whether a create-request status entry of one machine shows it still running (None: not listed = gone)."""
    if machine is None:
        return False
    if machine.get("result") == "fail":
        return False
    return str(machine.get("status", "")).lower() not in GONE_STATUSES


def return_verdicts(
    returned: Sequence[Mapping[str, Any]],
    create_entries: Mapping[str, Mapping[str, Any] | None],
) -> dict[str, ReturnVerdict]:
    """For each machine of a return request's status entry (``returned``), the verdict on its claim.

    ``create_entries`` maps a machine id to the ``getRequestStatus`` entry of the request that created it, polled
    in the same call (absent key: no create request known; None: the plugin did not report that request)."""
    verdicts = {}
    for m in returned:
        mid = m["machineId"]
        if m.get("result") != "succeed":
            verdicts[mid] = ReturnVerdict.NOT_CLAIMED
        elif mid not in create_entries or create_entries[mid] is None:
            verdicts[mid] = ReturnVerdict.UNVERIFIABLE
        else:
            entry = create_entries[mid]
            assert entry is not None
            seen = next((x for x in entry.get("machines") or [] if x.get("machineId") == mid), None)
            verdicts[mid] = ReturnVerdict.STILL_RUNNING if machine_alive(seen) else ReturnVerdict.CONFIRMED
    return verdicts
