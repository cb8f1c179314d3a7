"""What one orphan pass reads: the provider's listing, the controller's view, and the lease, each as the pure
classifier wants it (:class:`~provisionerd.orphan_model.Observation`).

A read never raises for a failure of what it reads: a listing that cannot be had (provider error, timeout, a
malformed document) is ``Unreadable(reason)``, and so is a controller view while the link is not joined and
resynced. The reasons are for the audit stream and the admin, so they hold no secrets: provider errors are
redacted by the runtime before they reach us, and link errors name addresses and causes only.

The order matters and is the caller's job: read the listing *first*, the view *after* (see
``Observation``'s docstring for why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from provisionerd.controller.lease import LeaseKeeper
from provisionerd.controller.session import ControllerSession, LinkState
from provisionerd.domain.errors import LeaseError, ProviderError
from provisionerd.domain.model import TAG_CLUSTER, TAG_INSTANCE, HostState, ProviderMachine
from provisionerd.orphans.model import ControllerState, LeaseState, Listing, ListingAbsent, Unreadable
from provisionerd.planner.fact_view import FactView
from provisionerd.provider.legacy.rules import invisible_classes
from provisionerd.provider.runtime import ProviderClient

#: The only provider actions an orphan *read* may call (the dry-run report calls nothing else).
READ_ONLY_ACTIONS = frozenset(
    {"describeProvider", "getAvailableTemplates", "getRequestStatus", "getReturnRequests", "listMachines"}
)


def listing_filter(cluster: str) -> dict[str, Any]:
    """The ``listMachines`` input: every live machine carrying this cluster's id tag. The provider tag is *not*
    filtered on, so a machine of this cluster tagged for another provider is listed (and left alone as not ours),
    and a fact naming it is not mistaken for a ghost.

    The contract requires the cluster tag in every filter, so a machine without it is invisible here: if someone
    strips the tags of a machine we track, its fact becomes a ghost and is eventually retired (a ``Lost`` fact);
    the machine itself is never touched, as no action ever targets a machine the listing does not show as ours."""
    return {"tags": {TAG_CLUSTER: cluster}}


def machines_from_listing(document: Mapping[str, Any]) -> tuple[ProviderMachine, ...]:
    """The ``listMachines`` output (already schema-checked by the runtime) as ``ProviderMachine`` values.

    Raises ``ValueError`` for a document that still does not have the shape (a runtime that skipped its check).
    """
    machines = document.get("machines")
    if not isinstance(machines, list):
        raise ValueError("listMachines output has no 'machines' list")
    out = []
    for i, entry in enumerate(machines):
        try:
            tags = entry["tags"]
            launch = entry["launchtime"]
            if not isinstance(tags, Mapping) or not all(isinstance(v, str) for v in tags.values()):
                raise TypeError("tags must map strings to strings")
            if isinstance(launch, bool) or not isinstance(launch, (int, float)) or not math.isfinite(launch):
                raise TypeError("launchtime must be a number")
            out.append(
                ProviderMachine(
                    machine_id=str(entry["machineId"]),
                    name=str(entry.get("name", "")),
                    result="succeed",
                    status=str(entry.get("status", "")),
                    launch_time=float(launch),
                    address=str(entry.get("privateIpAddress", "") or ""),
                    instance_ref=str(tags.get(TAG_INSTANCE, "")),
                    tags=dict(tags),
                )
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"listMachines output: machines[{i}]: {exc}") from None
    return tuple(out)


def listing_absent(client: ProviderClient) -> ListingAbsent | None:
    """``ListingAbsent`` for a client that says it has no ``listMachines`` (its ``features``, as the legacy LSF
    adapter has them), else ``None``. Clients without a ``features`` attribute are asked, never presumed."""
    features = getattr(client, "features", None)
    if not isinstance(features, Mapping) or features.get("listMachines", False):
        return None
    invisible = invisible_classes(features)
    return ListingAbsent(f"the provider has no listMachines: {', '.join(invisible)} orphans are invisible", invisible)


def unknown_outcomes(client: ProviderClient) -> tuple[dict[str, Any], ...]:
    """The create requests whose outcome the client knows to be unknown (the legacy adapter's journal); their
    machines, if any, no listing can show. Empty for a client that does not keep such a record."""
    read = getattr(client, "unknown_outcomes", None)
    return tuple(read()) if callable(read) else ()


async def read_listing(client: ProviderClient, cluster: str, *, timeout: float | None = None) -> Listing:
    """``listMachines`` for this cluster's machines, or ``Unreadable`` with the reason it could not be read
    (``ListingAbsent``, without calling anything, for a provider that has no listing)."""
    absent = listing_absent(client)
    if absent is not None:
        return absent
    try:
        document = await client.call("listMachines", listing_filter(cluster), timeout=timeout)
        return machines_from_listing(document)
    except ProviderError as exc:
        return Unreadable(str(exc))
    except ValueError as exc:
        return Unreadable(str(exc))


@attrs.frozen
class ControllerRead:
    """The controller's side of one observation: the fact view and hosts (or ``Unreadable``) and its state."""

    view: FactView | Unreadable
    hosts: tuple[HostState, ...] = ()
    controller: ControllerState = ControllerState()


class SettleTracker:
    """Whether ``settle`` seconds (trio's clock) have passed since the current controller generation came up.

    Every (re)join starts the window again: after a failover the new primary's host states are only trustworthy
    once workers had their chance to rejoin it, and a daemon that rejoined cannot tell a failover from a blip.
    Feed it ``joined(generation)`` from ``session.on_resync``; a generation first seen by ``settled`` without that
    call counts from the moment it is seen (later, never earlier, than it really came up: the safe side).
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


def read_session(session: ControllerSession, tracker: SettleTracker, provider: str | None = None) -> ControllerRead:
    """The session's current view, if it is joined to a primary and resynced; ``Unreadable`` otherwise.

    With ``provider``, the view must also come from a resync sent after that provider's last lease grant: facts
    another daemon committed while we held no lease are never pushed to us, so an older view would make its
    machines look like orphans (seen in simulation seed 257 after a takeover).
    """
    view = session.view
    if session.state is not LinkState.UP or view is None:
        why = f"controller link is {session.state.value}" + (f": {session.last_error}" if session.last_error else "")
        return ControllerRead(Unreadable(why))
    if provider is not None and not session.synced_for(provider):
        return ControllerRead(Unreadable(f"view predates the lease grant for {provider!r}; waiting for its resync"))
    # The session joins only a primary and breaks the link when told it no longer is one.
    settled = tracker.settled(view.generation)
    return ControllerRead(view.facts, tuple(view.hosts.values()), ControllerState(primary=True, settled=settled))


def read_keeper(keeper: LeaseKeeper) -> LeaseState:
    """The lease as the keeper trusts it *now* (on its own clock)."""
    try:
        return LeaseState(held=True, epoch=keeper.current())
    except LeaseError:
        return LeaseState()


ControllerReader = Callable[[], ControllerRead]
LeaseReader = Callable[[], LeaseState]
