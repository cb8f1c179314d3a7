"""What the planner decides: frozen action values for the driver to run through the mutation gate, and notes.

Every action that starts something new carries a fresh ``op_id`` (see :mod:`provisionerd.planner.plan` for the
scheme). The driver commits the matching fact first (``RequestIntent``, ``ReturnIntent``, ``Lost``,
``RequestFailed``) and only then calls the provider, so an action the gate refuses or never commits must be
reported back as :class:`provisionerd.planner.state.ActionDropped`; until then the planner counts it as in flight and
does not plan it again.
"""

from __future__ import annotations

import attrs

from provisionerd.domain.model import NO_QUOTE, PriceQuote


@attrs.frozen
class RequestMachines:
    """Commit a ``RequestIntent(op_id, ..., count, demand_id)``, then ``requestMachines`` with that op_id."""

    op_id: str
    provider: str
    template_id: str
    count: int
    demand_id: str
    #: The item's reservation and release mode, for the intent (``planner.release``).
    reservation: str = ""
    release: str = ""
    #: The chosen offer's quote, for the intent and its instance facts (``provisionerd cost``).
    price: PriceQuote = NO_QUOTE
    #: All ``count`` machines or none (``DemandItem.all_or_nothing``), on the intent and the plugin's input.
    all_or_nothing: bool = False


@attrs.frozen
class ReturnMachines:
    """Commit a ``ReturnIntent(op_id, machine_ids, reason)``, then ``requestReturnMachines``.

    ``reason`` is one of ``idle``, ``never_joined``, ``max_ttl``, ``drained``, ``drain_timeout``, ``released``,
    ``provisioning_timeout``, or ``capability_mismatch: <why>`` (the machine's report fell short of its template,
    ``planner.health``).
    """

    op_id: str
    provider: str
    machine_ids: tuple[str, ...]
    reason: str


@attrs.frozen
class MarkLost:
    """Commit a ``Lost(op_id, machine_id, reason)`` fact; no provider call (the provider took the machine)."""

    op_id: str
    provider: str
    machine_id: str
    reason: str


@attrs.frozen
class FailRequest:
    """Commit ``RequestFailed(op_id, reason)`` for an open intent. ``op_id`` is the intent's own, not a new one."""

    op_id: str
    provider: str
    reason: str


@attrs.frozen
class DrainMachines:
    """Commit a ``DrainRequested(op_id, machine_ids, reason, at)`` fact; no provider call (the controller stops
    placing work on the machines; ``planner.drain`` returns them when idle or ``drain_timeout`` after ``at``)."""

    op_id: str
    provider: str
    machine_ids: tuple[str, ...]
    reason: str
    at: float


Action = RequestMachines | ReturnMachines | MarkLost | FailRequest | DrainMachines


@attrs.frozen
class Note:
    """Something the planner wants logged or raised as an event (``kind`` is a stable word for machines).

    From :func:`provisionerd.planner.plan.plan`: ``stale_snapshot``, ``no_snapshot``, ``invalid_demand``,
    ``unmet_demand`` (with why: step limit, or no eligible offer with room), ``deferred`` (returns waiting for a
    throttle), ``unknown_reclaim``, ``duplicate_offer``, ``capability_mismatch`` (a machine short of its
    template), ``provider_protected`` (``max_unhealthy`` stopped replacement).
    From :func:`provisionerd.planner.state.observe`:
    ``offer_unavailable``, ``provider_throttled``, ``provider_paused`` (raise it as an event), ``provider_resumed``.
    """

    kind: str
    detail: str
    provider: str = ""
    demand_id: str = ""
    #: ``unmet_demand``: the rules that left it unmet, as stable words (``planner.unmet_rules``).
    rules: tuple[str, ...] = ()
