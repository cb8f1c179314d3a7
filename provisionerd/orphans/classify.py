"""The orphan classifier: what leaked, in which class, what to do about it, and what stops us doing it.

Pure and synchronous: no I/O, no trio, ``now`` comes in with the observation. One call is one pass over one
provider; the daemon runs a pass per interval (the rate cap counts per pass) and carries the returned memory to
the next pass. The dry-run admin report is the same call with ``policy.dry_run`` set.

Classes
-------
``never_joined``
    A machine we requested (its instance fact is live, or it carries the op tag of one of our request intents and
    has no instance fact yet: a create that crashed before its fact was written) with no host state at all by
    ``join_deadline`` after its cloud launch time. Action ``return``, automatic. Younger ones are not findings.
``tagged_unknown``
    Carries this cluster's id tag and this provider's tag but no live fact (none at all, or one that says
    returned/lost). When it matches exactly one live host (instance ref, machine id, hostname or address) that no
    tracked machine claims: ``adopt``. Otherwise the policy's ``orphan_action``: ``report`` (default), or
    ``stop``/``terminate`` once older than ``orphan_grace`` measured from the cloud launch time.
``ghost``
    A live (not returning) fact whose machine the provider no longer lists. Action ``retire`` (a ``Lost`` fact),
    allowed only once ``ghost_confirmations`` (at least 2) consecutive listings missed it, and never while the
    controller still sees its host alive (then the listing, not the machine, is suspect).
``license``
    A licence grant with more units than anyone uses (see :class:`~provisionerd.orphans.model.CountedResource`).
    ``return`` (through ``returnLicenses``) when the controller's in-use count is 0, the licence source agrees and
    the grant is older than ``orphan_grace`` from its checkout time (unknown: ``launch_time_unknown``); otherwise
    ``report``. Never ``return`` while the controller counts a unit in use or does not say. Its op_id also names
    the grant's checkout time and size, so a later leak of the same pool is a new return, not a replay.

Ownership
---------
A listed machine without *both* this cluster's id tag and this provider's tag is never a finding and never the
target of an action, whatever a fact says about its id. Protected machines (``policy.protect_tag``) are findings
(so they show in the report) but nothing touches them.

An unreadable view
------------------
If the provider's listing or the controller's view could not be read, the pass acts on nothing: every finding
carries ``listing_unreadable``/``view_unreadable`` and ``allowed`` is empty. Classification is also narrowed to
what the remaining view proves: without the listing there is no ``tagged_unknown`` or ``ghost`` finding (absence
from a listing we did not get proves nothing) and ghost counts neither grow nor reset; ``never_joined`` is still
reported from the facts alone (live fact, launch time known, past the deadline, no host). Without the controller's
view nothing can be told apart (every machine would look unknown), so only ``license`` findings remain.

Preconditions are listed, with the actions each applies to, in :mod:`provisionerd.orphans.gates`; finding-level
ones (``grace``, ``launch_time_unknown``, ``ghost_unconfirmed``, ``host_alive``, ``ambiguous_match``,
``already_reported``) come from :mod:`provisionerd.orphans.detect`. Adoption is not held back by ``orphan_grace``:
it touches nothing and the live host is the evidence.

Wiring (for the daemon and the CLI)
-----------------------------------
Daemon, per provider per interval: read ``listMachines`` (or ``Unreadable``), *then* the fact view and hosts; call
:func:`classify`; for each ``PlannedAction`` commit ``action.fact()`` through the mutation gate and, for
``return``/``stop``/``terminate``, then call the provider with ``action.op_id``; feed each cleanup's answer to
``memory.after_cleanup(ok)``; keep ``result.memory`` for the next pass; write every finding to the audit stream.
CLI dry run: the same call with ``dry_run`` set and the lease/controller state as it is known (the CLI holds no
lease, so ``no_lease`` shows too); print :func:`provisionerd.orphans.report.render_table` or ``render_json``.
"""

from __future__ import annotations

from provisionerd.domain.model import Epoch
from provisionerd.orphans.detect import Candidate, detect
from provisionerd.orphans.gates import breaker_state, gate
from provisionerd.orphans.model import (  # noqa: F401  (the public names, importable from here)
    BLOCKERS,
    LICENSE,
    ORPHAN_CLASSES,
    BreakerState,
    Classification,
    ClassifierMemory,
    ControllerState,
    CountedResource,
    Finding,
    LeaseState,
    ListingAbsent,
    Observation,
    PlannedAction,
    Unreadable,
    evidence_json,
    orphan_op_id,
)
from provisionerd.orphans.policy import OrphanPolicy

_CLASS_RANK = {name: rank for rank, name in enumerate(ORPHAN_CLASSES)}


def classify(obs: Observation, policy: OrphanPolicy, memory: ClassifierMemory | None = None) -> Classification:
    """Classify one provider's possible orphans and decide which actions may run now.

    Args:
        obs: the listing (read first), the controller's view and host states, counted grants, the lease and the
            controller's state, the cluster id, the provider's name and ``now``.
        policy: the provider's knobs.
        memory: the memory returned by the previous pass for this provider (``None`` on the first pass).

    Returns:
        Every finding, sorted by class then id, each with its ``blocked_by``; the memory for the next pass; the
        allowed actions (at most ``max_cleanup_per_interval`` cleanups, none when dry-run, the breaker open or a
        view unreadable), each stamped with the lease epoch and a stable op_id; and the breaker's state.
    """
    memory = ClassifierMemory() if memory is None else memory
    detection = detect(obs, policy, memory.ghost_misses)
    candidates = sorted(detection.candidates, key=lambda c: (_CLASS_RANK[c.orphan_class], c.machine_id))
    breaker = breaker_state(candidates, detection.known_machines, policy, memory)
    blocked = gate(candidates, obs, policy, breaker)
    epoch = obs.lease.epoch if obs.lease.usable else None
    findings = []
    allowed = []
    for candidate, blocked_by in zip(candidates, blocked, strict=True):
        evidence = {**candidate.evidence, "epoch": None if epoch is None else str(epoch)}
        finding = Finding(
            candidate.orphan_class, obs.provider, candidate.machine_id, evidence, candidate.action, blocked_by
        )
        findings.append(finding)
        if finding.allowed and epoch is not None:  # without an epoch, no_lease has blocked it already
            allowed.append(_planned(candidate, finding, obs.provider, epoch))
    listing_skip = "listing_absent" if isinstance(obs.listing, ListingAbsent) else "listing_unreadable"
    skipped = tuple(
        name
        for name, view in ((listing_skip, obs.listing), ("view_unreadable", obs.view))
        if isinstance(view, Unreadable)
    )
    next_memory = ClassifierMemory(ghost_misses=detection.ghost_misses, failed_cleanups=memory.failed_cleanups)
    return Classification(tuple(findings), next_memory, tuple(allowed), breaker, skipped)


def _planned(candidate: Candidate, finding: Finding, provider: str, epoch: Epoch) -> PlannedAction:
    key = finding.machine_id
    if finding.orphan_class == LICENSE:
        key = f"{key}\0{finding.evidence.get('checked_out')}\0{finding.evidence.get('granted')}"
    return PlannedAction(
        kind=finding.action,
        orphan_class=finding.orphan_class,
        provider=provider,
        machine_id=finding.machine_id,
        op_id=orphan_op_id(provider, finding.orphan_class, key, finding.action),
        units=candidate.units,
        epoch=epoch,
        machine_name=candidate.machine_name,
        instance_ref=candidate.instance_ref,
        hostname=candidate.hostname,
        address=candidate.address,
        evidence_json=evidence_json(finding.evidence),
    )


__all__ = [
    "BLOCKERS",
    "BreakerState",
    "Classification",
    "ClassifierMemory",
    "ControllerState",
    "CountedResource",
    "Finding",
    "LeaseState",
    "Observation",
    "OrphanPolicy",
    "PlannedAction",
    "Unreadable",
    "classify",
]
