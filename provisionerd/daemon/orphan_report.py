"""``provisionerd orphans --dry-run``'s report: what looks orphaned, classified as the daemon would, changing nothing.

``dry_run(config)`` reads every provider's ``listMachines`` first (through a ``ReadOnlyClient``, which refuses
every action but the read-only ones), and the licence grants of every provider that declares licence pools
(``listLicenses``: orphan class ``license``), then joins the controller as its own identity
(``<identity>-orphans-report``) for one resync of the facts and hosts (no lease, no commit:
``orphan_direct.read_controller_once``), and
classifies each provider with the provider's orphan policy in dry run and no lease held, so each automatic action
shows what would be done and everything that blocks it (``no_lease`` and ``dry_run`` at least). A provider that
cannot list machines (a legacy LSF plugin) is stated as such (``invisible``, ``unknown_outcomes``), not reported
unreadable. ``provisionerd orphans --dry-run`` prints the ``DryRunReport``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from provisionerd.config.loader import Config
from provisionerd.controller.session_settings import StreamFactory
from provisionerd.daemon.clients import ReadOnlyClient, open_clients
from provisionerd.daemon.orphan_admin import policy_of, side_identity
from provisionerd.daemon.orphan_direct import read_controller_once
from provisionerd.execution.orphan_cycle import open_ops_of, with_owners
from provisionerd.execution.orphan_licences import Grants, LicenseReads, counted
from provisionerd.execution.orphan_reads import licenses_in_use, read_listing, unknown_outcomes
from provisionerd.orphans.classify import Observation, OrphanPolicy, classify
from provisionerd.orphans.model import BreakerState, Finding, LeaseState, Listing, ListingAbsent, Unreadable
from provisionerd.provider.client import ProviderClient


@attrs.frozen
class DryRunReport:
    findings: tuple[Finding, ...]
    breakers: Mapping[str, BreakerState]
    unreadable: tuple[str, ...]  # one line per view that could not be read
    mutations: int
    calls: Mapping[str, tuple[str, ...]]  # provider -> every action asked of it
    invisible: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)  # provider -> classes it cannot see
    unknown_outcomes: Mapping[str, tuple[dict[str, Any], ...]] = attrs.field(factory=dict)  # of those providers


async def dry_run(
    config: Config,
    *,
    providers: Sequence[str] = (),
    clients: Mapping[str, ProviderClient] | None = None,
    connect: StreamFactory | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 - bounds the wait for the controller, after which it is unreadable
    wall_clock: Callable[[], float] = time.time,
) -> DryRunReport:
    """The dry-run report. ``clients``/``connect`` default to the config's plugins and mutual TLS."""
    names = tuple(providers) or config.provider_names
    policies = {name: policy_of(config.provider(name), dry_run=True) for name in names}
    if connect is None:
        from provisionerd.controller.connect import tls_connector  # loads the TLS files: ConfigError when they are bad

        connect = tls_connector(config)
    if clients is None:
        async with open_clients(config, names) as opened:
            return await _dry_run(config, names, policies, opened, connect, timeout, wall_clock)
    return await _dry_run(config, names, policies, clients, connect, timeout, wall_clock)


async def _dry_run(
    config: Config,
    names: Sequence[str],
    policies: Mapping[str, OrphanPolicy],
    clients: Mapping[str, ProviderClient],
    connect: StreamFactory,
    timeout: float,  # noqa: ASYNC109 - passed on to read_controller_once
    wall_clock: Callable[[], float],
) -> DryRunReport:
    guarded = {name: ReadOnlyClient(clients[name]) for name in names}
    listings: dict[str, Listing] = {}
    grants: dict[str, Grants] = {}
    for name in names:  # every listing before the controller's view (see Observation)
        timeout_for = config.provider(name).timeouts.for_action("listMachines")
        expected = config.provider(name).max_machines
        listings[name] = await read_listing(guarded[name], config.cluster, timeout=timeout_for, expected=expected)
        grants[name] = await LicenseReads(name).read(guarded[name], config.cluster)  # class d: only declared pools
    controller = await read_controller_once(config, connect, timeout, identity=side_identity(config.identity, "report"))
    # A provider without a listing (ListingAbsent) is not unreadable: the report states what it cannot see.
    unreadable = [
        f"the listing of provider {name!r} could not be read: {listing.reason}"
        for name, listing in listings.items()
        if isinstance(listing, Unreadable) and not isinstance(listing, ListingAbsent)
    ]
    unreadable += [
        f"the licence pools of provider {name!r} could not be read: {read.reason}"
        for name, read in grants.items()
        if isinstance(read, Unreadable)
    ]
    absent = {name: listing for name, listing in listings.items() if isinstance(listing, ListingAbsent)}
    if isinstance(controller.view, Unreadable):
        unreadable.append(f"the controller's view could not be read: {controller.view.reason}")
    findings: list[Finding] = []
    breakers: dict[str, BreakerState] = {}
    now = wall_clock()
    for name in names:
        obs = Observation(
            cluster_id=config.cluster,
            provider=name,
            now=now,
            listing=listings[name],
            view=controller.view,
            hosts=controller.hosts,
            licenses=counted(grants[name], licenses_in_use(controller.demand, name)),
            lease=LeaseState(),  # this command holds no lease, ever
            controller=controller.controller,
        )
        result = classify(obs, policies[name])
        findings += with_owners(result.findings, open_ops_of(controller.view, name))
        breakers[name] = result.breaker
    return DryRunReport(
        findings=tuple(findings),
        breakers=breakers,
        unreadable=tuple(unreadable),
        mutations=sum(c.mutations for c in guarded.values()),
        calls={name: tuple(c.calls) for name, c in guarded.items()},
        invisible={name: listing.invisible for name, listing in absent.items()},
        unknown_outcomes={name: unknown_outcomes(guarded[name]) for name in absent},
    )
