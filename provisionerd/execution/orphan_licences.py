"""Orphan class ``license`` (d): what one pass reads of a provider's licence pools, and the one mutation it makes.

Reads (``LicenseReads.read``, after the listing and before the controller's view, like the listing):

- a provider is asked ``listLicenses`` only when its client can (``provider.client.LicenseReader``) *and* its
  ``describeProvider`` features say ``licensePools``; the answer to ``describeProvider`` is kept for the cycle's
  life (asked again after a failure). A plugin that does not declare pools is never asked: ``NO_POOLS``;
- a failure (a typed ``ProviderError``: the plugin refused, timed out, crashed, or answered garbage, which the
  transport's schema check or ``contract.read_licenses`` refuse as ``ProviderAnswerInvalid``, and pages that do not
  join up as ``PagingViolation``) is ``Unreadable(reason)``: counted per error type (``errors``), logged, and the
  pass classifies no licence (nothing can rest on an answer it did not get). Work is bounded by the transport's
  line cap, the schema's ``maxItems`` per page and ``paging.max_pages``.

What the controller says is in use (``CountedResource.in_use``) comes from ``ControllerRead.licenses_in_use``
(``None``: the controller does not say, which is never read as 0, so such a grant is only reported).

The mutation (``return_grant``): only for an allowed ``license``/``return`` action (the classifier allowed it: in
use 0 by the controller's count, the source agrees, older than ``orphan_grace``, lease, primary, settled, not dry
run, breaker closed, under the rate cap). The action's fact (an ``OrphanReported`` of class ``license`` whose
evidence holds the units and the op_id) is committed through the executor first, under the lease epoch; only then is
``returnLicenses`` called with the same op_id, the plugin's idempotency key.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from provisionerd.domain.errors import ProviderError
from provisionerd.domain.model import Fact
from provisionerd.orphans.model import CountedResource, PlannedAction, Unreadable
from provisionerd.provider.client import LicenseClient, LicenseReader, ProviderReader
from provisionerd.provider.contract import cluster_filter
from provisionerd.provider.values import LicenseGrant, LicenseReturn, OwnerTags

log = logging.getLogger(__name__)


@attrs.frozen
class NoPools:
    """The provider declares no licence pools (or its client cannot read them): it is never asked."""


NO_POOLS = NoPools()
Grants = tuple[LicenseGrant, ...] | Unreadable | NoPools


class LicenseReads:
    """One provider's licence reads across passes: the declared feature (kept) and the errors (counted)."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.declared: bool | None = None  # None: not known yet (ask describeProvider)
        self.errors: Counter[str] = Counter()  # error type -> failed reads
        self.last: Grants = NO_POOLS  # the last pass's read, for its audit

    async def read(self, client: ProviderReader, cluster: str, *, timeout: float | None = None) -> Grants:  # noqa: ASYNC109
        """The provider's grants to ``cluster``, ``NO_POOLS``, or ``Unreadable`` (see the module docstring)."""
        self.last = await self._read(client, cluster, timeout)
        return self.last

    async def _read(self, client: ProviderReader, cluster: str, timeout: float | None) -> Grants:  # noqa: ASYNC109
        if not isinstance(client, LicenseReader):
            return NO_POOLS
        try:
            if self.declared is None:
                known = client.known_features
                features = known if known is not None else (await client.describe_provider()).features
                self.declared = features.license_pools
            if not self.declared:
                return NO_POOLS
            return await client.list_licenses(cluster_filter(cluster), timeout=timeout)
        except ProviderError as exc:
            self.errors[type(exc).__name__] += 1
            log.warning(
                "licence pools of provider %s unreadable (%s, %d so far): %s",
                self.provider,
                type(exc).__name__,
                sum(self.errors.values()),
                exc,
            )
            return Unreadable(f"{type(exc).__name__}: {exc}")


def counted(grants: Grants, in_use: Mapping[str, int] | None) -> tuple[CountedResource, ...]:
    """The grants as the classifier counts them. ``in_use``: what the controller says is in use per pool (``None``,
    or a pool it does not name: it does not say)."""
    if not isinstance(grants, tuple):
        return ()
    controller = {} if in_use is None else in_use
    return tuple(
        CountedResource(
            g.pool,
            g.granted,
            controller.get(g.pool),
            provider_agrees=g.in_use == 0,
            provider_in_use=g.in_use,
            checked_out=g.checked_out,
        )
        for g in grants
    )


def grants_summary(grants: Grants) -> dict[str, Any]:
    """What an ``orphan_pass`` event says of the licence read."""
    if isinstance(grants, NoPools):
        return {"read": "no_pools"}
    if isinstance(grants, Unreadable):
        return {"read": "unreadable", "reason": grants.reason}
    return {"read": "ok", "pools": len(grants)}


class LicenseExecutor(Protocol):
    """What ``return_grant`` uses of the executor: its commit (under the lease epoch) and its provider clients."""

    async def commit_fact(self, fact: Fact) -> int: ...

    def client(self, provider: str) -> Any: ...


async def return_grant(executor: LicenseExecutor, action: PlannedAction, cluster: str) -> dict[str, Any]:
    """Commit the action's record, then ``returnLicenses`` (see the module docstring). Returns the answer for the
    audit; raises the commit's ``ProvisionerdError`` (the gate refused: nothing was asked) or the provider's
    ``ProviderError``."""
    if action.orphan_class != "license" or action.kind != "return" or action.units < 1:
        raise ValueError(f"not a licence return: {action.orphan_class}/{action.kind} of {action.units} units")
    client = executor.client(action.provider)
    if not isinstance(client, LicenseClient):
        raise ValueError(f"the client of provider {action.provider!r} cannot return licences")
    index = await executor.commit_fact(action.fact())
    owner = OwnerTags(cluster, action.provider, action.op_id, action.epoch)
    accepted = await client.return_licenses(LicenseReturn(action.machine_id, action.units, owner))
    return {"fact_index": index, "request_id": accepted.request_id, "message": accepted.message}
