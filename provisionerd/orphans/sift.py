"""Listed machines the classifier would pass over, told apart while the listing is read, so a pass holds only ids
for them (issue 36: at 100k machines the rows of a whole listing held ~94 MB until the pass ended).

Pure. A listed machine is *settled* when the classifier (``orphans.detect``) would find nothing on it whatever else
the listing says about its id: it is live, carries this cluster's and this provider's tags and no protect tag, and
the view has its fact for this provider, either returning (the return path owns it) or active and joined (adopted,
or a host of this provider has its instance ref) or still inside its join deadline. Everything else is kept as
listed and classified in full.

The pass reads the view of the moment for each page (``orphan_reads.read_listing``), which is later than that page
was listed, as ``Observation`` wants; the view the pass then classifies against is later still, and so is its
``now``. A fact that changed between the two, or a join deadline that passed meanwhile, can only have made the
machine settle one pass early: the next pass lists it again. Against one and
the same view a sifted observation classifies exactly as the whole listing does (tests/orphans/test_sift.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

import attrs

from provisionerd.domain.model import TAG_CLUSTER, TAG_PROVIDER, HostState, ListedMachine
from provisionerd.orphans.detect import GONE_STATUSES, launch_of
from provisionerd.planner.fact_view import MachineRecord, MachineState


@attrs.frozen
class SiftKeys:
    """What sifting compares a listed machine with: this cluster and provider, the protect tag, and the view's
    machines and its hosts by instance ref (the session's own maps, read, never copied)."""

    cluster_id: str
    provider: str
    protect_tag: str
    machines: Mapping[str, MachineRecord]
    hosts: Mapping[str, HostState]
    #: Wall-clock epoch seconds, no later than the pass's ``Observation.now`` (infinity: a machine that has not
    #: joined is never settled), and the pass's policy's join deadline.
    now: float = math.inf
    join_deadline: float = 0.0


def settled_by(machine: ListedMachine, keys: SiftKeys) -> MachineRecord | None:
    """The fact that settles ``machine`` (see the module docstring), or ``None``."""
    tags = machine.tags
    if (
        not keys.cluster_id
        or machine.status in GONE_STATUSES
        or tags.get(TAG_CLUSTER) != keys.cluster_id
        or tags.get(TAG_PROVIDER) != keys.provider
        or keys.protect_tag in tags
    ):
        return None
    record = keys.machines.get(machine.machine_id)
    if record is None or record.provider != keys.provider:
        return None
    if record.state is MachineState.RETURNING:
        return record
    if record.state is not MachineState.ACTIVE:
        return None
    if record.adopted:
        return record
    host = keys.hosts.get(record.instance_ref) if record.instance_ref else None
    if host is not None and host.provider == keys.provider:
        return record
    launch = launch_of(machine.launch_time, record.launch_time)
    return record if launch is not None and keys.now - launch < keys.join_deadline else None


M = TypeVar("M", bound=ListedMachine)


def sift(rows: Iterable[M], keys: SiftKeys) -> tuple[list[str], list[M]]:
    """(the ids of the settled machines, the rest as listed). A settled id is the view's own string, so holding
    it holds nothing the view does not."""
    settled: list[str] = []
    kept: list[M] = []
    for machine in rows:
        record = settled_by(machine, keys)
        if record is None:
            kept.append(machine)
        else:
            settled.append(record.machine_id)
    return settled, kept


def hosts_by_ref(hosts: Iterable[HostState]) -> dict[str, HostState]:
    """Host states by instance ref, as the session keeps them (``ControllerView.hosts``): the last of a ref wins."""
    return {host.instance_ref: host for host in hosts if host.instance_ref}
