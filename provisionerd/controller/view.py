"""What the controller session knows, rebuilt from scratch after every (re)join: pure, no I/O.

``ControllerView`` is the daemon's whole picture of the controller for one *generation* (one joined link): the
facts folded from that link's resync (plus the facts this daemon committed on it), the hosts from the resync and
later pushes, and the demand snapshot received on it. Its facts hold live state only (``FactView(prune=True)``): a
lifecycle that ends, in a fold of the daemon's own commit or of an incremental resync, leaves the view at once, as
it leaves the controller's resync set. A new generation inherits nothing from an older one but its
facts, and those only when the controller is the same incarnation and answers an incremental resync (protocol
§6.3): then the later facts are folded into them.
A link resyncs more than once (a lease was granted, the demand snapshot did not come, the periodic refresh): each
resync builds a new view of the same generation, numbered by ``sync_seq``, that keeps only the link's demand.

``DemandAssembler`` turns ``DemandPage`` pushes into whole ``DemandSnapshot``s; ``ResyncCollector`` gathers the
pages of one resync reply. Both bound what a hostile or broken controller can make us hold, and raise
``ProtocolError`` on pages that cannot belong to a valid sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

import attrs

from provisionerd.controller.joined_file import JoinedRefs
from provisionerd.domain.errors import ProtocolError
from provisionerd.domain.model import CommittedFact, DemandItem, DemandSnapshot, HostState, LicenseUse
from provisionerd.planner.fact_view import FactView, fold

#: Bounds per snapshot / resync. Far above any real cluster, far below what would exhaust memory.
MAX_PAGES = 10_000
MAX_DEMAND_ITEMS = 1_000_000
#: ``fold_step``'s limit when a caller folds all that is ready at once.
MAX_FOLD = 1 << 62


@attrs.define(eq=False)
class ControllerView:
    """The daemon's view for one generation. ``demand`` is ``None`` until a snapshot arrives on this link."""

    generation: int
    primary: str
    term: int
    facts: FactView
    #: instance_ref -> latest state. From a resync this is ``facts.hosts``, the host table the fact view keeps joined
    #: against its machines, so a plan pass reads its indexes instead of scanning every host and machine.
    hosts: MutableMapping[str, HostState]
    demand: DemandSnapshot | None = None
    version: int = 0  # bumped on every change, so watchers can tell "changed since I looked"
    #: The session's resync-want counter when this view's ResyncRequest was sent: every want registered at or
    #: below it (e.g. "resync after this lease grant") is answered by facts the controller read after the want.
    sync_seq: int = 0
    #: Instance refs that had a host at any time since the daemon started: the session's one set, shared by every
    #: view it builds, so a controller restart (its host table empty until the workers rejoin) does not empty it
    #: (planner.rejoin: a machine that joined once is never retired as never joined).
    joined: JoinedRefs = attrs.field(factory=JoinedRefs)

    @property
    def complete(self) -> bool:
        """Resync folded and a fresh demand snapshot received: safe to reconcile."""
        return self.demand is not None

    def apply_hosts(self, hosts: Iterable[HostState]) -> None:
        for host in hosts:
            self.hosts[host.instance_ref] = host
            self.joined.add(self.hosts[host.instance_ref].instance_ref)  # the string the table keeps (HostTable)
        self.version += 1

    def apply_fact(self, committed: CommittedFact) -> None:
        self.facts.apply(committed)
        self.version += 1

    def set_demand(self, snapshot: DemandSnapshot) -> None:
        self.demand = snapshot
        self.version += 1


class DemandAssembler:
    """Collects the pages of demand snapshots; ``add`` returns a snapshot once all its pages are in.

    Level-triggered: a snapshot with a ``seq`` at or below the last one completed is ignored, and a newer ``seq``
    discards an unfinished older one.
    """

    def __init__(self) -> None:
        self.last_seq: int | None = None
        self._seq: int | None = None
        self._count = 0
        self._pages: dict[int, tuple[DemandItem, ...]] = {}
        self._items = 0
        self._licenses: tuple[LicenseUse, ...] = ()  # page 0's

    def add(
        self,
        seq: int,
        page: int,
        page_count: int,
        items: tuple[DemandItem, ...],
        licenses: tuple[LicenseUse, ...] = (),
    ) -> DemandSnapshot | None:
        if not 1 <= page_count <= MAX_PAGES or not 0 <= page < page_count:
            raise ProtocolError(f"demand page {page} of {page_count} is out of range")
        if self.last_seq is not None and seq <= self.last_seq:
            return None
        if seq != self._seq:
            self._seq, self._count, self._pages, self._items, self._licenses = seq, page_count, {}, 0, ()
        elif page_count != self._count:
            raise ProtocolError(f"demand snapshot {seq} changed its page count from {self._count} to {page_count}")
        if page not in self._pages:
            self._items += len(items)
            if self._items > MAX_DEMAND_ITEMS:
                raise ProtocolError(f"demand snapshot {seq} has more than {MAX_DEMAND_ITEMS} items")
            self._pages[page] = items
            if page == 0:
                self._licenses = licenses
        if len(self._pages) < self._count:
            return None
        items_all = tuple(item for i in range(self._count) for item in self._pages[i])
        snapshot = DemandSnapshot(seq, items_all, self._licenses)
        self.last_seq, self._seq, self._pages = seq, None, {}
        return snapshot


class ResyncCollector:
    """The pages of one resync reply, in any order; ``add`` returns True when the last one is in.

    A full resync is folded as its pages come, in page order (a page that comes early waits for the ones before
    it): each page costs its own fold, never the whole resync's at the end, and its decoded facts are dropped once
    folded, so a resync of 100,000 machines neither holds the loop for seconds nor holds every fact twice. An
    incremental one is small and folds at the end (``build_incremental``), into the facts the daemon holds.
    """

    def __init__(self) -> None:
        self._count: int | None = None
        self._pages: dict[int, tuple[tuple[CommittedFact, ...], tuple[HostState, ...]]] = {}
        self._folded = 0  # pages 0 .. _folded-1 are in ``_view`` (full resync only)
        #: Page ``_folded`` in log order while it is folded in steps (``fold_step``), and how much of it is in.
        self._current: list[CommittedFact] | None = None
        self._offset = 0
        self._view: FactView | None = None
        #: What the first page said (protocol §6.3): every page of one resync says the same.
        self.incremental = False
        self.as_of = 0
        self.host_seq = 0

    def add(
        self,
        page: int,
        page_count: int,
        facts: tuple[CommittedFact, ...],
        hosts: tuple[HostState, ...],
        tail: tuple[bool, int, int] = (False, 0, 0),
        *,
        fold: bool = True,
    ) -> bool:
        """``tail``: the page's ``(incremental, as_of, host_seq)``. A full resync's pages are folded here as they
        come in order, unless ``fold`` is False: then the caller folds them in steps (``fold_step``)."""
        if not 1 <= page_count <= MAX_PAGES or not 0 <= page < page_count:
            raise ProtocolError(f"resync page {page} of {page_count} is out of range")
        if self._count is None:
            self._count = page_count
            self.incremental, self.as_of, self.host_seq = tail
        elif page_count != self._count:
            raise ProtocolError(f"resync changed its page count from {self._count} to {page_count}")
        elif tail != (self.incremental, self.as_of, self.host_seq):
            raise ProtocolError("the pages of one resync disagree on incremental, asOf or hostSeq")
        self._pages.setdefault(page, (facts, hosts))
        if not self.incremental and fold:
            self._fold_ready()
        return len(self._pages) == self._count

    def _fold_ready(self) -> None:
        """Fold the pages that follow the ones folded already (full resync), and forget their facts."""
        while self.fold_step(MAX_FOLD):
            pass

    def fold_step(self, limit: int) -> bool:
        """Fold at most ``limit`` more facts of the pages ready (a full resync: the pages that follow the ones
        folded already, in log order), a page's hosts once all its facts are in, and forget what was folded.
        True while more is ready: a caller that checkpoints between steps holds its loop for ``limit`` facts'
        folds at a time, whatever the page size."""
        view = self._view
        if view is None:
            view = self._view = FactView(prune=True)  # the daemon's view holds live state only
        left = limit
        while self._folded in self._pages and left > 0:
            facts, hosts = self._pages[self._folded]
            if self._current is None:
                self._current, self._offset = sorted(facts, key=lambda f: f.index), 0
            chunk = self._current[self._offset : self._offset + left]
            fold(chunk, view)
            self._offset += len(chunk)
            left -= len(chunk)
            if self._offset >= len(self._current):
                for host in hosts:
                    view.hosts[host.instance_ref] = host
                self._pages[self._folded] = ((), ())
                self._folded += 1
                self._current = None
        return self._folded in self._pages

    def _facts(self) -> list[CommittedFact]:
        return sorted((f for fs, _ in self._pages.values() for f in fs), key=lambda f: f.index)

    def _hosts(self) -> list[HostState]:
        return [host for i in sorted(self._pages) for host in self._pages[i][1]]

    def build_incremental(
        self, base: FactView, generation: int, primary: str, term: int, *, sync_seq: int = 0, version: int = 0
    ) -> ControllerView:
        """The view after an incremental resync: ``base`` (the facts this daemon holds) with the later facts
        folded in, and the hosts replaced by the resync's (they are always sent whole)."""
        hosts = base.hosts
        for ref in [ref for ref in hosts]:
            del hosts[ref]
        for host in self._hosts():
            hosts[host.instance_ref] = host
        base.apply_after_sync(self._facts(), self.as_of)
        return ControllerView(
            generation=generation,
            primary=primary,
            term=term,
            facts=base,
            hosts=hosts,
            version=version,
            sync_seq=sync_seq,
        )

    def build(self, generation: int, primary: str, term: int, *, sync_seq: int = 0, version: int = 0) -> ControllerView:
        """The resynced view: facts folded in log order (page by page as they came), hosts keyed by instance_ref in
        the view's host table (which keeps its join index right whichever of a machine and its host comes first)."""
        # An incremental reply answered as full by a caller is folded now, and so is what a caller folding in steps
        # (``fold_step``) left.
        self.incremental = False
        self._fold_ready()
        view = self._view
        assert view is not None
        view.mark_synced(self.as_of)
        return ControllerView(
            generation=generation,
            primary=primary,
            term=term,
            facts=view,
            hosts=view.hosts,
            version=version,
            sync_seq=sync_seq,
        )
