"""Detection: which machines, facts and grants look orphaned, in which class, with which evidence.

Pure. This module decides the *class*, the *action* the class calls for, and the blockers that belong to the
finding itself (its age, a ghost's second read, an ambiguous host match, a report already made). Blockers that
belong to the pass (lease, controller, unreadable views, breaker, rate cap, dry run) are added by
:mod:`provisionerd.orphans.gates`.

Ownership is decided here once: a listed machine is ours only when it carries this cluster's id tag *and* this
provider's tag. Any other machine never becomes a finding, whatever the facts say about its id; it still counts
as "listed", so a fact naming it is not a ghost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_INSTANCE,
    TAG_OP,
    TAG_PROVIDER,
    HostStatus,
    ListedMachine,
    ProviderMachine,
)
from provisionerd.orphans.hosts import HostIndex, host_evidence
from provisionerd.orphans.model import (
    ALREADY_REPORTED,
    AMBIGUOUS_MATCH,
    GHOST,
    GHOST_UNCONFIRMED,
    GRACE,
    HOST_ALIVE,
    LAUNCH_TIME_UNKNOWN,
    LICENSE,
    NEVER_JOINED,
    TAGGED_UNKNOWN,
    CountedResource,
    Observation,
)
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.planner.fact_view import FactView, MachineRecord, MachineState

#: Listed statuses that mean the machine is gone (the contract lists only live machines; this is defence).
GONE_STATUSES = frozenset({"terminated"})


@attrs.frozen
class Candidate:
    """A finding before the pass-wide gates. ``evidence`` is a plain dict, frozen when the Finding is built."""

    orphan_class: str
    machine_id: str
    action: str
    evidence: dict[str, Any] = attrs.field(hash=False)
    blockers: tuple[str, ...] = ()
    protected: bool = False
    machine_name: str = ""
    instance_ref: str = ""
    hostname: str = ""
    address: str = ""
    units: int = 0  # a licence return's units


@attrs.frozen
class Detection:
    candidates: tuple[Candidate, ...]
    ghost_misses: Mapping[str, int] = attrs.field(hash=False)
    known_machines: int  # owned listed machines plus live facts not listed: the breaker's denominator


def launch_of(*times: float) -> float | None:
    """The first usable launch time (finite, positive) of ``times``, or ``None``."""
    for value in times:
        if type(value) is float and 0 < value < math.inf:  # a ProviderMachine's: the common case, one test
            return value
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            return float(value)
    return None


def _index_listing(
    listing: Sequence[ListedMachine], cluster_id: str, provider: str, protect_tag: str
) -> tuple[set[str], dict[str, ListedMachine]]:
    """(every listed live id, the owned ones by id). A listing that contradicts itself about a duplicated id is
    read the safe way: the machine is owned only if every live copy is, and protected if any copy is, a
    terminated one included (the first live copy is kept, with the protect tag added)."""
    if cluster_id:
        # The usual listing, every machine live, ours and listed once, says so in one comprehension (the loop below
        # read it in ~1.2 us a machine, 0.12 s a pass at 100k machines). A protect tag needs nothing more here: it
        # is copied onto a machine from another copy of its id, and every id is listed once.
        owned = {
            m.machine_id: m
            for m in listing
            if m.status not in GONE_STATUSES
            and (tags := m.tags).get(TAG_CLUSTER) == cluster_id
            and tags.get(TAG_PROVIDER) == provider
        }
        if len(owned) == len(listing):
            return set(owned), owned
    return _index_each(listing, cluster_id, provider, protect_tag)


def _index_each(
    listing: Sequence[ListedMachine], cluster_id: str, provider: str, protect_tag: str
) -> tuple[set[str], dict[str, ListedMachine]]:
    """``_index_listing`` machine by machine: any listing."""
    listed: set[str] = set()
    owned: dict[str, ListedMachine] = {}
    disowned: set[str] = set()
    protect: dict[str, str] = {}  # id -> the protect tag's value, from any copy, a terminated one included
    for machine in listing:  # once per listed machine, 100k at a time: each attribute read once, no call
        tags, machine_id = machine.tags, machine.machine_id
        if protect_tag in tags:
            protect.setdefault(machine_id, tags[protect_tag])
        if machine.status in GONE_STATUSES:
            continue
        listed.add(machine_id)
        if not (cluster_id and tags.get(TAG_CLUSTER) == cluster_id and tags.get(TAG_PROVIDER) == provider):
            disowned.add(machine_id)
            continue
        owned.setdefault(machine_id, machine)
    for machine_id in disowned:
        owned.pop(machine_id, None)
    for machine_id, kept in owned.items():
        if machine_id in protect and protect_tag not in kept.tags:
            tags = {**kept.tags, protect_tag: protect[machine_id]}
            owned[machine_id] = ProviderMachine(
                machine_id, kept.name, "succeed", kept.status, kept.launch_time, kept.address, kept.instance_ref, tags
            )
    return listed, owned


def _cleared(cleared: frozenset[str], listed: set[str], owned: dict[str, ListedMachine]) -> frozenset[str]:
    """The owned machines among the ids sifted out while listing (``orphans.sift``), and ``owned`` made what the
    whole listing would give: one is owned unless another copy of it, kept in the listing, is not ours (then it is
    not owned at all); an owned one is cleared, so it is not classified again. Every cleared id is listed too: the
    ghost search reads ``cleared`` beside ``listed`` (the kept ids) rather than a union of the two, 100k ids a pass
    copied for one lookup each."""
    if not cleared:
        return cleared
    disowned = listed - owned.keys()
    for machine_id in [i for i in owned if i in cleared]:  # the kept listing is the small side: 100k ids cleared
        del owned[machine_id]
    return cleared - disowned if disowned else cleared


def detect(obs: Observation, policy: OrphanPolicy, ghost_misses: Mapping[str, int]) -> Detection:
    """Classify one provider's machines, facts and grants. See :func:`provisionerd.orphans.classify.classify`."""
    listing = obs.listing if isinstance(obs.listing, tuple) else None
    view = obs.view if isinstance(obs.view, FactView) else None
    candidates: list[Candidate] = []
    misses: Mapping[str, int] = ghost_misses  # an unreadable listing is neither a "found" nor a "not found"
    known = 0
    if view is not None:
        live = view.live_machines(obs.provider)  # once: the host index and the ghost search both read it
        hosts = HostIndex(obs.hosts, obs.provider, view, live)
        if listing is not None:
            listed, owned = _index_listing(listing, obs.cluster_id, obs.provider, policy.protect_tag)
            cleared = _cleared(obs.cleared, listed, owned)
            # In the listing's order: ``classify`` sorts the candidates (by class, then id), so sorting the whole
            # fleet here first would only cost time (~50 ms at 100k machines).
            for machine in owned.values():
                found = _classify_listed(machine, obs, policy, view, hosts)
                if found is not None:
                    candidates.append(found)
            ghosts, misses = _ghosts(obs, policy, live, hosts, listed, obs.cleared, ghost_misses)
            candidates += ghosts
            known = len(owned) + len(cleared) + len(ghosts)
        else:
            candidates += _never_joined_from_facts(obs, policy, view, hosts)
    candidates += (_license(r, obs, policy, view) for r in sorted(obs.licenses, key=_pool) if r.granted > r.used)
    return Detection(tuple(candidates), dict(misses), known)


def _age(now: float, launch: float | None) -> float | None:
    return None if launch is None else now - launch


def _base_evidence(machine: ListedMachine, now: float, launch: float | None) -> dict[str, Any]:
    return {
        "tags": dict(machine.tags),
        "name": machine.name,
        "address": machine.address,
        "status": machine.status,
        "launch_time": launch,
        "age": _age(now, launch),
        "matching_host": None,
    }


def _classify_listed(
    machine: ListedMachine, obs: Observation, policy: OrphanPolicy, view: FactView, hosts: HostIndex
) -> Candidate | None:
    record = view.machines.get(machine.machine_id)
    if record is not None and record.provider != obs.provider:
        record = None  # the fact is another provider's; for this provider the machine has no fact
    if record is not None and record.state is MachineState.RETURNING:
        return None  # its return is in flight: the reconciler owns it
    if record is not None and record.state is MachineState.ACTIVE:
        # Once per listed machine (100k at a time), so the common outcomes return before any call they can skip.
        if record.adopted or hosts.joined(record.machine_id, record.instance_ref):
            return None  # it joined (an adopted machine matched a live host when adopted)
        launch = launch_of(machine.launch_time, record.launch_time)
        if launch is not None and obs.now - launch < policy.join_deadline:
            return None  # still on its way up (as _never_joined would say)
        return _never_joined(machine, obs, policy, launch, "instance_fact", record.op_id, record.instance_ref)
    instance_ref = machine.tags.get(TAG_INSTANCE, "") or machine.instance_ref
    op_id = machine.tags.get(TAG_OP, "")
    intent = view.intents.get(op_id) if op_id else None
    if record is None and intent is not None and intent.intent.provider == obs.provider:
        joined = hosts.joined(machine.machine_id, instance_ref) or bool(hosts.live_matches(machine, instance_ref))
        if joined and intent.open:
            # Explained by a pending intent: the executor (or its recovery after a restart) is about to commit
            # this machine's instance fact. Adopting it here would race that fact and strip the machine of its
            # demand attribution (seen in the demo: adopted, then returned as surplus while still wanted).
            return None
        # A create that crashed before its instance fact: ours by the op tag, so the join deadline applies,
        # unless a host already joined as it and its intent is closed (then it is adopted below).
        if not joined:
            launch = launch_of(machine.launch_time)
            return _never_joined(machine, obs, policy, launch, "intent_tag", op_id, instance_ref)
    return _tagged_unknown(machine, obs, policy, view, hosts, instance_ref, record)


def _never_joined(
    machine: ListedMachine,
    obs: Observation,
    policy: OrphanPolicy,
    launch: float | None,
    source: str,
    op_id: str,
    instance_ref: str,
) -> Candidate | None:
    age = _age(obs.now, launch)
    if age is not None and age < policy.join_deadline:
        return None  # still on its way up: not an orphan yet
    evidence = _base_evidence(machine, obs.now, launch)
    evidence.update(source=source, op_id=op_id, instance_ref=instance_ref, join_deadline=policy.join_deadline)
    return Candidate(
        NEVER_JOINED,
        machine.machine_id,
        "return",
        evidence,
        blockers=(LAUNCH_TIME_UNKNOWN,) if launch is None else (),
        protected=policy.protect_tag in machine.tags,
        machine_name=machine.name,
        instance_ref=instance_ref,
        address=machine.address,
    )


def _tagged_unknown(
    machine: ListedMachine,
    obs: Observation,
    policy: OrphanPolicy,
    view: FactView,
    hosts: HostIndex,
    instance_ref: str,
    record: MachineRecord | None,
) -> Candidate:
    launch = launch_of(machine.launch_time)
    evidence = _base_evidence(machine, obs.now, launch)
    evidence.update(
        op_id=machine.tags.get(TAG_OP, ""),
        instance_ref=instance_ref,
        fact_state=None if record is None else record.state.value,
        orphan_grace=policy.orphan_grace,
    )
    protected = policy.protect_tag in machine.tags
    matches = hosts.live_matches(machine, instance_ref)
    if matches:
        host = matches[0]
        evidence["matching_host"] = host_evidence(host) if len(matches) == 1 else None
        if len(matches) > 1:
            evidence["matching_hosts"] = [host_evidence(h) for h in matches]
        return Candidate(
            TAGGED_UNKNOWN,
            machine.machine_id,
            "adopt",
            evidence,
            blockers=(AMBIGUOUS_MATCH,) if len(matches) > 1 else (),
            protected=protected,
            machine_name=machine.name,
            instance_ref=instance_ref or host.instance_ref,
            hostname=host.hostname,
            address=host.address or machine.address,
        )
    action = policy.orphan_action
    blockers: tuple[str, ...] = ()
    if action == "stop" and machine.status == "stopped":
        action = "none"  # already quarantined: stopping again would only spend the rate cap
    elif action in ("stop", "terminate"):
        if launch is None:
            blockers = (LAUNCH_TIME_UNKNOWN,)
        elif obs.now - launch < policy.orphan_grace:
            blockers = (GRACE,)
    elif _reported(view, machine.machine_id, TAGGED_UNKNOWN):
        blockers = (ALREADY_REPORTED,)
    return Candidate(
        TAGGED_UNKNOWN,
        machine.machine_id,
        action,
        evidence,
        blockers=blockers,
        protected=protected,
        machine_name=machine.name,
        instance_ref=instance_ref,
        address=machine.address,
    )


def _reported(view: FactView | None, machine_id: str, orphan_class: str) -> bool:
    report = None if view is None else view.reported_orphans.get(machine_id)
    return report is not None and report.orphan_class == orphan_class


def _ghosts(
    obs: Observation,
    policy: OrphanPolicy,
    live: list[MachineRecord],
    hosts: HostIndex,
    listed: set[str],
    cleared: frozenset[str],
    previous: Mapping[str, int],
) -> tuple[list[Candidate], dict[str, int]]:
    """Live (ACTIVE) facts whose machine is not listed (``live``: the view's live machines of this provider; the
    listed ids are ``listed``, the live ones the listing kept, and ``cleared``, those sifted out). A RETURNING one
    is left to the return path, which will record it returned. The counts kept are exactly those of machines
    missing now: a reappearance resets."""
    candidates: list[Candidate] = []
    misses: dict[str, int] = {}
    # The unlisted ones, then sorted: sorting every live machine first cost ~60 ms at 100k, almost all listed.
    active = MachineState.ACTIVE
    unlisted = [m for m in live if m.state is active and (i := m.machine_id) not in cleared and i not in listed]
    for record in sorted(unlisted, key=lambda m: m.machine_id):
        count = previous.get(record.machine_id, 0) + 1
        misses[record.machine_id] = count
        alive = [h for h in hosts.strong(record.machine_id, record.instance_ref) if h.status is not HostStatus.LOST]
        launch = launch_of(record.launch_time)
        blockers = []
        if count < policy.ghost_confirmations:
            blockers.append(GHOST_UNCONFIRMED)
        if alive:
            blockers.append(HOST_ALIVE)
        evidence = {
            "not_found_reads": count,
            "op_id": record.op_id,
            "instance_ref": record.instance_ref,
            "hostname": record.hostname,
            "address": record.address,
            "launch_time": launch,
            "age": _age(obs.now, launch),
            "adopted": record.adopted,
            "matching_host": host_evidence(alive[0]) if alive else None,
        }
        candidates.append(
            Candidate(GHOST, record.machine_id, "retire", evidence, tuple(blockers), instance_ref=record.instance_ref)
        )
    return candidates, misses


def _never_joined_from_facts(
    obs: Observation, policy: OrphanPolicy, view: FactView, hosts: HostIndex
) -> list[Candidate]:
    """With no listing this pass, the facts alone still show machines that never joined. They are reported
    (every pass-wide gate blocks them); a launch time from the fact is required, nothing is guessed."""
    candidates = []
    for record in sorted(view.live_machines(obs.provider), key=lambda m: m.machine_id):
        if record.state is not MachineState.ACTIVE or record.adopted:
            continue
        if hosts.joined(record.machine_id, record.instance_ref):
            continue
        launch = launch_of(record.launch_time)
        if launch is None or obs.now - launch < policy.join_deadline:
            continue
        evidence: dict[str, Any] = {
            "tags": {},
            "name": record.hostname,
            "address": record.address,
            "status": None,
            "launch_time": launch,
            "age": obs.now - launch,
            "matching_host": None,
            "source": "instance_fact",
            "op_id": record.op_id,
            "instance_ref": record.instance_ref,
            "join_deadline": policy.join_deadline,
        }
        candidates.append(
            Candidate(NEVER_JOINED, record.machine_id, "return", evidence, instance_ref=record.instance_ref)
        )
    return candidates


def _pool(resource: CountedResource) -> str:
    return resource.resource


def _license(resource: CountedResource, obs: Observation, policy: OrphanPolicy, view: FactView | None) -> Candidate:
    """A grant with more units than anyone uses: ``return`` when nothing holds it by every count (the controller's
    in use 0, the licence source agrees), after ``orphan_grace`` from its checkout; otherwise ``report``. Never
    ``return`` while the controller counts a unit in use or does not say (``in_use`` ``None``)."""
    returnable = resource.returnable
    checked_out = launch_of(resource.checked_out)
    evidence: dict[str, Any] = {
        "granted": resource.granted,
        "in_use": resource.in_use,
        "in_use_source": "controller" if resource.in_use is not None else "unknown (the controller does not say)",
        "provider_in_use": resource.provider_in_use,
        "provider_agrees": resource.provider_agrees,
        "idle": resource.granted - resource.used,
        "returnable": returnable,
        "checked_out": checked_out,
        "age": _age(obs.now, checked_out),
        "orphan_grace": policy.orphan_grace,
    }
    blockers: tuple[str, ...] = ()
    if returnable:
        if checked_out is None:
            blockers = (LAUNCH_TIME_UNKNOWN,)
        elif obs.now - checked_out < policy.orphan_grace:
            blockers = (GRACE,)
    elif _reported(view, resource.resource, LICENSE):
        blockers = (ALREADY_REPORTED,)
    action = "return" if returnable else "report"
    return Candidate(
        LICENSE, resource.resource, action, evidence, blockers, units=resource.granted if returnable else 0
    )
