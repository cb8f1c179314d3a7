"""Listed machines the classifier would pass over, told apart while the listing is read, so a pass holds only ids
for them (issue 36: at 100k machines the rows of a whole listing held ~94 MB until the pass ended).

Pure. A listed machine is *cleared* when the classifier (``orphans.detect``) would find nothing on it: it is live,
carries this cluster's and this provider's tags and no protect tag, and the view has its fact for this provider,
either returning (the return path owns it) or active and joined (adopted, or a host of this provider has its
instance ref) or still inside its join deadline. Everything else is kept as listed and classified in full. Copies of
one id in a listing end as the page join ends them, the later one winning (``Sifting.resolve``). ("Cleared", not
"settled": that word is the controller's settle window, ``ControllerState.settled``.)

The pass reads the view of the moment for each page (``orphan_reads.read_listing``), which is later than that page
was listed, as ``Observation`` wants; the view the pass then classifies against is later still, and so is its
``now``. A fact that changed between the two, or a join deadline that passed meanwhile, can only have cleared a
machine one pass early: the next pass lists it again. Against one and the same view a sifted observation classifies
exactly as the joined listing does (tests/orphans/test_sift.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    #: joined is never cleared), and the pass's policy's join deadline.
    now: float = math.inf
    join_deadline: float = 0.0


def clearer(keys: SiftKeys) -> Callable[[ListedMachine], MachineRecord | None]:
    """The rule of the module docstring for ``keys``: given a listed machine, the fact that clears it, or ``None``.
    ``keys`` are read once here (the rule runs once per listed machine, 100k a pass: ~0.5 us each)."""
    cluster_id, provider, protect_tag, now, deadline = (
        keys.cluster_id,
        keys.provider,
        keys.protect_tag,
        keys.now,
        keys.join_deadline,
    )
    machines, hosts = keys.machines.get, keys.hosts.get
    active, returning = MachineState.ACTIVE, MachineState.RETURNING

    def cleared(machine: ListedMachine) -> MachineRecord | None:
        tags = machine.tags
        if (
            not cluster_id
            or machine.status in GONE_STATUSES
            or tags.get(TAG_CLUSTER) != cluster_id
            or tags.get(TAG_PROVIDER) != provider
            or protect_tag in tags
        ):
            return None
        record = machines(machine.machine_id)
        if record is None or record.provider != provider:
            return None
        state = record.state
        if state is returning:
            return record
        if state is not active:
            return None
        if record.adopted:
            return record
        host = hosts(record.instance_ref) if record.instance_ref else None
        if host is not None and host.provider == provider:
            return record
        launch = launch_of(machine.launch_time, record.launch_time)
        return record if launch is not None and now - launch < deadline else None

    return cleared


M = TypeVar("M", bound=ListedMachine)


@attrs.define
class Sifting:
    """One listing sifted page by page: the cleared ids, and where the last cleared and the last kept copy of each
    id stood in the listing, so that ``resolve`` gives what a join of every page gives (``provider.paging.PageJoin``:
    the later copy of an id wins). Copies of one id can disagree (a launch time, a protect tag) and clear or not
    alike only by their fact."""

    #: id -> position of its last cleared copy (the id is the view's own string).
    cleared: dict[str, int] = attrs.field(factory=dict)
    #: id -> position of its last kept copy.
    kept_at: dict[str, int] = attrs.field(factory=dict)
    position: int = 0

    def page(self, rows: Iterable[M], keys: SiftKeys | None) -> list[M]:
        """The rows of one page to keep (all of them without ``keys``: no view to sift against)."""
        clear = clearer(keys) if keys is not None else None
        cleared, kept_at, position = self.cleared, self.kept_at, self.position
        kept: list[M] = []
        for machine in rows:
            position += 1
            record = clear(machine) if clear is not None else None
            if record is None:
                kept.append(machine)
                kept_at[machine.machine_id] = position
            else:
                cleared[record.machine_id] = position
        self.position = position
        return kept

    def resolve(self, joined: Sequence[M]) -> tuple[tuple[M, ...], frozenset[str]]:
        """(the listing, the cleared ids) from ``joined``, the join of the kept rows: an id both cleared and kept
        keeps only its later copy."""
        cleared, kept_at = self.cleared, self.kept_at
        clash = {i: kept_at[i] < at for i in kept_at if (at := cleared.get(i)) is not None}  # True: cleared later
        if not clash:
            return tuple(joined), frozenset(cleared)
        rows = tuple(m for m in joined if not clash.get(m.machine_id, False))
        return rows, frozenset(i for i in cleared if clash.get(i, True))
