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
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
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


M = TypeVar("M", bound=ListedMachine)


@attrs.define
class Sifting:
    """One listing sifted page by page: the cleared ids, and where each cleared and the last kept copy of each id
    stood in the listing, so that ``resolve`` gives what a join of every page gives (``provider.paging.PageJoin``:
    the later copy of an id wins). Copies of one id can disagree (a launch time, a protect tag) and clear or not
    alike only by their fact.

    The cleared ids are kept in listing order, in a list and their positions in an array (no int object each),
    rather than in a dict: 100k appends a pass cost ~30 ms less than 100k dict stores, and only ``resolve`` reads
    positions, for the few ids also kept."""

    #: The cleared ids (the view's own strings) and each one's position in the listing, in listing order.
    cleared_ids: list[str] = attrs.field(factory=list)
    cleared_at: array[int] = attrs.field(factory=lambda: array("q"))
    #: id -> position of its last kept copy.
    kept_at: dict[str, int] = attrs.field(factory=dict)
    position: int = 0

    def page(self, rows: Iterable[M], keys: SiftKeys | None) -> list[M]:
        """The rows of one page to keep (all of them without ``keys``, or without a cluster id: no view to sift
        against), the others cleared by the rule of the module docstring.

        The rule is written out in this one loop, with no call per row: it runs once per listed machine, 100k a
        pass, and a call and its keys read per row were a third of a pass's sifting (111 against 71 ms at 100k,
        measured in one run)."""
        kept: list[M] = []
        kept_at, position = self.kept_at, self.position
        if keys is None or not keys.cluster_id:
            for machine in rows:
                position += 1
                kept.append(machine)
                kept_at[machine.machine_id] = position
            self.position = position
            return kept
        cluster_id, provider, protect_tag, now, deadline = (
            keys.cluster_id,
            keys.provider,
            keys.protect_tag,
            keys.now,
            keys.join_deadline,
        )
        machines, hosts = keys.machines.get, keys.hosts.get
        active, returning, gone, inf = MachineState.ACTIVE, MachineState.RETURNING, GONE_STATUSES, math.inf
        cleared_id, cleared_at = self.cleared_ids.append, self.cleared_at.append
        for machine in rows:
            position += 1
            tags = machine.tags
            if (
                machine.status not in gone
                and tags.get(TAG_CLUSTER) == cluster_id
                and tags.get(TAG_PROVIDER) == provider
                and protect_tag not in tags
                and (record := machines(machine.machine_id)) is not None
                and record.provider == provider
            ):
                state = record.state
                if state is returning or (
                    state is active
                    and (
                        record.adopted
                        or (
                            (ref := record.instance_ref)
                            and (host := hosts(ref)) is not None
                            and host.provider == provider
                        )
                        or (
                            (
                                launch := (
                                    listed
                                    if type(listed := machine.launch_time) is float and 0 < listed < inf
                                    else launch_of(listed, record.launch_time)
                                )
                            )
                            is not None
                            and now - launch < deadline
                        )
                    )
                ):
                    cleared_id(record.machine_id)
                    cleared_at(position)
                    continue
            kept.append(machine)
            kept_at[machine.machine_id] = position
        self.position = position
        return kept

    def resolve(self, joined: Sequence[M]) -> tuple[tuple[M, ...], frozenset[str]]:
        """(the listing, the cleared ids) from ``joined``, the join of the kept rows: an id both cleared and kept
        keeps only its later copy."""
        ids, kept_at = self.cleared_ids, self.kept_at
        if not kept_at:
            return tuple(joined), frozenset(ids)
        # The last cleared copy of each id also kept (the kept ids are the few: a scan in C, no dict of 100k).
        last = dict(compress(zip(ids, self.cleared_at, strict=True), map(kept_at.__contains__, ids)))
        clash = {i: kept_at[i] < at for i, at in last.items()}  # True: the cleared copy is the later one
        if not clash:
            return tuple(joined), frozenset(ids)
        rows = tuple(m for m in joined if not clash.get(m.machine_id, False))
        return rows, frozenset(i for i in ids if clash.get(i, True))
