"""What one orphan pass reads: the provider's listing, the controller's view, and the lease, each as the pure
classifier wants it (:class:`~provisionerd.orphans.model.Observation`).

The listing is read through the provider's typed client (``ProviderReader.list_machines``: ``ProviderMachine``
values). A read never raises for a failure of what it reads: a listing that cannot be had (provider
error, timeout, a malformed document) is ``Unreadable(reason)``, and so is a controller view while the link is not
joined and resynced. The reasons are for the audit stream and the admin, so they hold no secrets: provider errors are
redacted by the runtime before they reach us, and link errors name addresses and causes only.

The order matters and is the caller's job: read the listing *first*, the view *after* (see
``Observation``'s docstring for why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.session import ControllerSession
from provisionerd.controller.session_settings import LinkState
from provisionerd.domain.errors import LeaseError, ProviderError
from provisionerd.domain.model import DemandSnapshot, HostState, ListedMachine
from provisionerd.orphans.model import ControllerState, LeaseState, Listing, ListingAbsent, Unreadable
from provisionerd.orphans.policy import OrphanPolicy
from provisionerd.orphans.sift import Sifting, SiftKeys
from provisionerd.planner.fact_view import FactView, MachineRecord
from provisionerd.provider.client import ProviderReader
from provisionerd.provider.contract import cluster_filter
from provisionerd.provider.legacy.rules import invisible_classes
from provisionerd.provider.values import ListingRow


def listing_filter(cluster: str) -> dict[str, str]:
    """The ``listMachines`` tags: every live machine carrying this cluster's id tag. The provider tag is *not*
    filtered on, so a machine of this cluster tagged for another provider is listed (and left alone as not ours),
    and a fact naming it is not mistaken for a ghost.

    The contract requires the cluster tag in every filter, so a machine without it is invisible here: if someone
    strips the tags of a machine we track, its fact becomes a ghost and is eventually retired (a ``Lost`` fact);
    the machine itself is never touched, as no action ever targets a machine the listing does not show as ours."""
    return cluster_filter(cluster)


def listing_absent(client: ProviderReader) -> ListingAbsent | None:
    """``ListingAbsent`` for a client that knows, without asking, that it has no ``listMachines`` (its
    ``known_features``, as the legacy LSF adapter has them), else ``None``. Other clients are asked, never
    presumed."""
    features = client.known_features
    if features is None or features.list_machines:
        return None
    invisible = invisible_classes(features.as_mapping())
    return ListingAbsent(f"the provider has no listMachines: {', '.join(invisible)} orphans are invisible", invisible)


def unknown_outcomes(client: ProviderReader) -> tuple[dict[str, Any], ...]:
    """The create requests whose outcome the client knows to be unknown (the legacy adapter's journal), shaped for
    the orphan report and its events; their machines, if any, no listing can show. Empty for a client that does
    not keep such a record."""
    return tuple(u.as_json() for u in client.unknown_outcomes())


async def read_listing(
    client: ProviderReader,
    cluster: str,
    *,
    timeout: float | None = None,  # noqa: ASYNC109
    expected: int = 0,
    sift: Sifter | None = None,
) -> Listing:
    """``listMachines`` for this cluster's machines, or ``Unreadable`` with the reason it could not be read
    (``ListingAbsent``, without calling anything, for a provider that has no listing).

    The listing is read page by page (``provisionerd.provider.paging``); ``expected`` (about how many machines
    the caller expects) sets the cap on pages, and pages that do not join up (a cursor loop, more pages than the
    cap, a page larger than asked) are ``Unreadable`` with that reason, like any other unreadable answer. ``sift``
    sifts each page as it is read (``Sifter``): the listing is then what it kept."""
    absent = listing_absent(client)
    if absent is not None:
        return absent
    try:
        return await client.list_machines(listing_filter(cluster), timeout=timeout, expected=expected, sift=sift)
    except ProviderError as exc:
        return Unreadable(str(exc))


@attrs.frozen
class ControllerRead:
    """The controller's side of one observation: the fact view and hosts (or ``Unreadable``) and its state."""

    view: FactView | Unreadable
    hosts: tuple[HostState, ...] = ()
    controller: ControllerState = ControllerState()
    #: Licence units in use per pool by the controller's count (``DemandPage.licenses``); ``None``, or a pool it does
    #: not name: it does not say, which the licence class never reads as 0.
    licenses_in_use: Mapping[str, int] | None = None
    #: The demand snapshot the licence use came from, for a reader of every provider at once (the dry run).
    demand: DemandSnapshot | None = None


class SettleTracker:
    """Whether ``settle`` seconds (trio's clock) have passed since the current controller generation came up.

    Every (re)join starts the window again: after a failover the new primary's host states are only trustworthy
    once workers had their chance to rejoin it, and a daemon that rejoined cannot tell a failover from a blip.
    ``read_session`` tells it when each generation came up (``session.up_since``); a generation first seen by
    ``settled`` without that counts from the moment it is seen (later, never earlier, than it really came up: the
    safe side).
    """

    def __init__(self, settle: float) -> None:
        if not settle >= 0:
            raise ValueError(f"settle must be a number of seconds >= 0, not {settle!r}")
        self.settle = settle
        self._generation: int | None = None
        self._since = math.inf

    def joined(self, generation: int, now: float | None = None) -> None:
        if generation != self._generation:
            self._generation = generation
            self._since = trio.current_time() if now is None else now

    def settled(self, generation: int, now: float | None = None) -> bool:
        now = trio.current_time() if now is None else now
        self.joined(generation, now)
        return now - self._since >= self.settle


def session_unreadable(session: ControllerSession, provider: str | None = None) -> str | None:
    """Why ``read_session`` would find the session's view unreadable now (for ``provider``: also a view older than
    its last lease grant), or ``None`` when it is readable. Reads nothing but the session's state."""
    if session.state is not LinkState.UP or session.view is None:
        return f"controller link is {session.state.value}" + (f": {session.last_error}" if session.last_error else "")
    if provider is not None and not session.synced_for(provider):
        return f"view predates the lease grant for {provider!r}; waiting for its resync"
    return None


def read_session(session: ControllerSession, tracker: SettleTracker, provider: str | None = None) -> ControllerRead:
    """The session's current view, if it is joined to a primary and resynced; ``Unreadable`` otherwise.

    With ``provider``, the view must also come from a resync sent after that provider's last lease grant: facts
    another daemon committed while we held no lease are never pushed to us, so an older view would make its
    machines look like orphans (seen in simulation seed 257 after a takeover).
    """
    why = session_unreadable(session, provider)
    if why is not None:
        return ControllerRead(Unreadable(why))
    view = session.view
    assert view is not None  # session_unreadable says so otherwise
    # The session joins only a primary and breaks the link when told it no longer is one.
    if math.isfinite(session.up_since):
        tracker.joined(view.generation, min(session.up_since, trio.current_time()))
    settled = tracker.settled(view.generation)
    state = ControllerState(primary=True, settled=settled)
    return ControllerRead(view.facts, tuple(view.hosts.values()), state, licenses_in_use(view.demand, provider))


def licenses_in_use(demand: DemandSnapshot | None, provider: str | None) -> dict[str, int] | None:
    """What the controller says is in use per licence pool of ``provider``, from its latest demand snapshot
    (``DemandSnapshot.licenses``); ``None`` when it names no pool of the provider (or no snapshot came yet): then
    it does not say, which the licence class never reads as 0."""
    if demand is None or provider is None:
        return None
    uses = {use.pool: use.in_use for use in demand.licenses if use.provider == provider}
    return uses or None


#: The view's machines and its hosts by instance ref as the session holds them now, or ``None`` while it has no
#: readable view (``peek_session``).
ViewPeek = Callable[[], tuple[Mapping[str, MachineRecord], Mapping[str, HostState]] | None]


def peek_session(
    session: ControllerSession, provider: str
) -> tuple[Mapping[str, MachineRecord], Mapping[str, HostState]] | None:
    """The session's machines and hosts, read in place, when ``read_session`` would read its view (``None``
    otherwise): what a ``Sifter`` compares each listing page with."""
    if session_unreadable(session, provider) is not None or session.view is None:
        return None
    return session.view.facts.machines, session.view.hosts


class Sifter:
    """Sifts an orphan pass's listing page by page (``orphans.sift``) against the view of the moment (``peek``);
    ``resolve`` then gives the listing and the cleared ids (``Observation.cleared``). A page read while the view is
    unreadable is kept whole."""

    def __init__(
        self, cluster: str, provider: str, policy: OrphanPolicy, peek: ViewPeek, wall_clock: Callable[[], float]
    ) -> None:
        self._cluster, self._provider, self._policy = cluster, provider, policy
        self._peek, self._wall_clock = peek, wall_clock
        self._sifting = Sifting()

    def __call__(self, rows: list[ListingRow]) -> list[ListingRow]:
        seen, policy = self._peek(), self._policy
        keys = None
        if seen is not None:
            now = self._wall_clock()
            keys = SiftKeys(self._cluster, self._provider, policy.protect_tag, *seen, now, policy.join_deadline)
        return self._sifting.page(rows, keys)

    def resolve(self, joined: Sequence[ListedMachine]) -> tuple[tuple[ListedMachine, ...], frozenset[str]]:
        return self._sifting.resolve(joined)


def expected_fleet(view: FactView | Unreadable, listed: int, *, floor: int = 0) -> int:
    """About how many machines the next listing should show, at most: the most of ``floor`` (the provider's
    configured ``max_machines``), every machine the controller's view knows (any provider, ended ones too: an upper
    bound that costs nothing to count) and what this listing showed (``listed``: ``Observation.listed_count``).
    Only the cap on pages (``paging.max_pages``) uses it, never a decision about a machine."""
    known = len(view.machines) if isinstance(view, FactView) else 0
    return max(floor, known, listed)


def read_keeper(keeper: LeaseKeeper) -> LeaseState:
    """The lease as the keeper trusts it *now* (on its own clock)."""
    try:
        return LeaseState(held=True, epoch=keeper.current())
    except LeaseError:
        return LeaseState()


ControllerReader = Callable[[], ControllerRead]
LeaseReader = Callable[[], LeaseState]
