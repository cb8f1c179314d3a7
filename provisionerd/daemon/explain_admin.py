"""The admin socket's ``explain`` and ``plan_what_if`` commands (``provisionerd explain``, ``provisionerd plan
--what-if``): the pure planner run on the daemon's live inputs, and why it does what it does.

``{"cmd": "explain", "demand_id": D}`` (``demand_id`` optional): the plan the loop would make now from its own
inputs (the view's facts, hosts and demand, the planner state, the offers of the providers it holds the lease of,
the policy in force, the settle window and the op book's actions in flight), explained per demand item by
:func:`provisionerd.planner.explain.explain`. ``{"cmd": "plan_what_if", "part": TEXT, "more": bool, "upload": U}``:
the same with the live demand replaced by a hypothetical one (a demand document, ``config.demand_doc``); a document
longer than one request line comes in parts (``more`` true: the reply names the ``upload`` the next part goes to).

Both change nothing: the plan's result (its actions, its next state) is read and dropped; nothing is dispatched and
no state of the loop is replaced. Since the planner is pure, its answer is the loop's own decision, not a second
implementation. What the plan cannot see is named beside it (``gates``): mutations halted after controller amnesia,
providers whose lease this daemon does not hold (standby; their offers are listed as ``not_leased`` per item), an
unhealthy provider and since when, a settle window after a (re)join.

Cost: the loop takes only references (the view, the planner state, the op book's in-flight actions, the offers);
the copies of the view's indexes (C-level dict copies) and the plan itself run in a worker thread when the fleet is
bigger than ``INLINE`` machines, so the event loop never waits for them. The loop keeps changing the view meanwhile:
the answer is kept only if the view is the same object at the same version afterwards (every change bumps it),
else it is made again, at most ``ATTEMPTS`` times.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from provisionerd.config.demand_doc import parse_demand
from provisionerd.controller.lease import LeaseKeeper, LeaseState
from provisionerd.controller.view import ControllerView
from provisionerd.daemon.admin_socket import Command
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import DemandSnapshot, Offer
from provisionerd.planner.explain import MAX_SURPLUS, Explanation, explain
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.in_flight import InFlight
from provisionerd.planner.offers import Catalog
from provisionerd.planner.plan import plan
from provisionerd.planner.policy import Policy
from provisionerd.planner.rejoin import Rejoin
from provisionerd.planner.state import PlannerState

log = logging.getLogger(__name__)

#: Machines up to which the copies and the plan run on the loop (a plan of this size takes a few milliseconds).
INLINE = 2000
#: Offers and surplus machines listed per item when every item is explained (``explain ID``: all offers, 50
#: machines); the rest are counted. The offers come most telling first (asked for, blocked, not tried, incompatible):
#: at 1,000 items with unmet demand a reply stays under 1 MiB (``bench/explain.py``), the client reads 4 MiB.
MAX_OFFERS = 3
MAX_SURPLUS_ALL = 5
#: Tries before giving up on a view that keeps changing under the plan.
ATTEMPTS = 4
#: A what-if document: bytes at most, uploads in progress at most, and how long an unfinished one is kept.
MAX_UPLOAD = 8 << 20
MAX_UPLOADS = 4
UPLOAD_TTL = 120.0


class Refused(ValueError):
    """A request the command cannot answer; its message says why."""


class LoopInputs(Protocol):
    """What the reconcile loop lends (``execution.loop.ReconcileLoop``), all read-only here."""

    @property
    def state(self) -> PlannerState: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def rejoin(self) -> Rejoin: ...
    def leased(self) -> list[str]: ...
    def settle_windows(self) -> dict[str, dict[str, Any]]: ...


@attrs.frozen
class Sources:
    """Where the live inputs are read, each at the request (a reload or a resync replaces them)."""

    view: Callable[[], ControllerView | None]
    loop: LoopInputs
    in_flight: Callable[[], InFlight]
    offers: Callable[[], list[Offer]]
    leases: Mapping[str, LeaseKeeper]
    guard_status: Callable[[], dict[str, Any]]
    wall: Callable[[], float]
    #: The providers whose plugins launch all or nothing (``ReconcileLoop.gang``).
    gang: Callable[[], frozenset[str]] = frozenset


@attrs.frozen
class _Inputs:
    """References taken on the loop; ``run`` copies what the loop mutates and plans (safe in a worker thread)."""

    view: ControllerView
    version: int
    state: PlannerState
    policy: Policy
    rejoin: Rejoin
    in_flight: InFlight
    offers: tuple[Offer, ...]
    unleased: Mapping[tuple[str, str], str]
    now: float
    gang: frozenset[str] = frozenset()

    def document(self, snapshot: DemandSnapshot | None, only: str | None) -> tuple[Explanation, list[dict[str, Any]]]:
        """``run`` and its items as JSON-ready dicts (in the worker thread too: a big answer is big to convert)."""
        if only is not None and (snapshot is None or all(i.demand_id != only for i in snapshot.items)):
            if only not in self.view.facts.active_by_demand:  # a scan of the demand: here, off the loop
                raise Refused(f"no demand item {only!r} in the demand nor among the machines")
        explanation = self.run(snapshot, only)
        return explanation, [attrs.asdict(item) for item in explanation.items]

    def run(self, snapshot: DemandSnapshot | None, only: str | None) -> Explanation:
        facts = _copy(self.view.facts)
        hosts = dict(self.view.hosts.items())
        policy = self.policy
        catalog = Catalog(  # as the loop builds it (ReconcileLoop._catalog_for)
            self.offers, policy.priorities, policy.template_priorities, policy.unverified, self.gang
        )
        result = plan(self.state, snapshot, facts, catalog, hosts, self.now, self.policy, self.rejoin, self.in_flight)
        return explain(
            result,
            snapshot,
            facts,
            hosts,
            catalog,
            self.state,
            self.policy,
            self.now,
            unleased=self.unleased,
            retiring=self.in_flight.retiring,
            only=only,
            max_offers=None if only is not None else MAX_OFFERS,
            max_surplus=MAX_SURPLUS if only is not None else MAX_SURPLUS_ALL,
        )


def _copy(facts: FactView) -> FactView:
    """The view's records as of now, in new dicts (each copied in one C call), with its own host table."""
    return attrs.evolve(
        facts,
        intents=dict(facts.intents),
        machines=dict(facts.machines),
        returns=dict(facts.returns),
        reported_orphans=dict(facts.reported_orphans),
        latest_epoch=dict(facts.latest_epoch),
        folded_above=set(),
        active_refs=dict(facts.active_refs),
        active_by_demand=dict(facts.active_by_demand),
        live_by_offer=dict(facts.live_by_offer),
        open_ops=dict(facts.open_ops),
        open_returns=dict(facts.open_returns),
        drained=dict(facts.drained),
        prune=False,
    )


@attrs.define
class _Upload:
    parts: list[str]
    size: int
    started: float


class Explainer:
    """The two commands over one set of :class:`Sources`; see the module docstring."""

    def __init__(self, sources: Sources, clock: Callable[[], float] = time.monotonic) -> None:
        self._sources = sources
        self._clock = clock
        self._uploads: dict[str, _Upload] = {}

    # --- the commands -------------------------------------------------------------------------------------------

    def explain_command(self) -> Command:
        async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
            only = request.get("demand_id")
            if only is not None and (not isinstance(only, str) or not only):
                return {"ok": False, "error": "demand_id must be a non-empty string"}
            try:
                return await self.answer(None, only)
            except Refused as exc:
                return {"ok": False, "error": str(exc)}

        return Command(run=run, timeout=lambda _request: 30.0)

    def what_if_command(self) -> Command:
        async def run(request: dict[str, Any], peer_uid: int | None) -> dict[str, Any]:
            try:
                text, token = self._receive(request)
                if text is None:
                    return {"ok": True, "upload": token}
                try:
                    items = parse_demand(text, "the what-if document")
                except ConfigError as exc:
                    raise Refused(str(exc)) from None
                return await self.answer(items, None)
            except Refused as exc:
                return {"ok": False, "error": str(exc)}

        return Command(run=run, timeout=lambda _request: 30.0)

    # --- the work -----------------------------------------------------------------------------------------------

    async def answer(self, what_if: tuple[Any, ...] | None, only: str | None) -> dict[str, Any]:
        """The reply document: the plan of the live inputs (with ``what_if`` as the demand, when given)."""
        for _ in range(ATTEMPTS):
            inputs = self._inputs()
            view = inputs.view
            snapshot = view.demand
            if what_if is not None:
                seq = max(inputs.state.applied_seq, 0 if snapshot is None else snapshot.seq)
                snapshot = DemandSnapshot(seq, what_if, () if snapshot is None else snapshot.licenses)
            if len(view.facts.machines) <= INLINE:
                return self._document(inputs, inputs.document(snapshot, only), what_if is not None)
            try:
                answer = await trio.to_thread.run_sync(inputs.document, snapshot, only)
            except Exception as exc:  # noqa: BLE001 - a record the loop changed while the thread read it
                if self._sources.view() is view and view.version == inputs.version:
                    raise  # not a change under it: a bug, which the admin guard answers and logs
                log.debug("explain: the view changed under the plan (%s); again", exc)
                continue
            if self._sources.view() is view and view.version == inputs.version:
                return self._document(inputs, answer, what_if is not None)
        raise Refused(f"the daemon's view kept changing during {ATTEMPTS} plans: try again")

    def _inputs(self) -> _Inputs:
        sources = self._sources
        view = sources.view()
        if view is None or not view.complete:
            raise Refused(
                "the daemon has no complete view of the controller yet (not joined, resynced and given demand)"
            )
        loop = sources.loop
        leased = set(loop.leased())
        offers, unleased = [], {}
        reasons = {name: self._not_leased(name) for name in sources.leases if name not in leased}
        for offer in sources.offers():
            if offer.provider in leased:
                offers.append(offer)
            else:
                unleased[(offer.provider, offer.template_id)] = reasons.get(offer.provider, "not served here")
        return _Inputs(
            view=view,
            version=view.version,
            state=loop.state,
            policy=loop.policy,
            rejoin=attrs.evolve(loop.rejoin, joined_before=view.joined),
            in_flight=sources.in_flight(),
            offers=tuple(offers),
            unleased=unleased,
            now=sources.wall(),
            gang=sources.gang(),
        )

    def _not_leased(self, provider: str) -> str:
        keeper = self._sources.leases.get(provider)
        if keeper is None:
            return f"provider {provider!r} not served here"
        status = keeper.status(trio.current_time())
        if status.state is LeaseState.HELD:
            return f"provider {provider!r}: lease held, waiting for a resync since its grant"
        why = f" ({status.reason})" if status.reason else ""
        return f"provider {provider!r}: lease {status.state.value}{why}: standby, no request goes there from here"

    def _gates(self, inputs: _Inputs) -> list[str]:
        """What stops or holds the plan's actions outside the plan: named beside it."""
        gates: list[str] = []
        guard = self._sources.guard_status()
        if guard.get("halted"):
            gates.append(f"halted (controller amnesia): no mutation until an admin decides: {guard.get('finding')}")
        for provider in sorted(self._sources.leases):
            if provider not in self._sources.loop.leased():
                gates.append(self._not_leased(provider))
        for provider, entry in sorted(inputs.state.capacity.unhealthy.items()):
            gates.append(f"{entry.reason(provider)}; unhealthy since {entry.since:.1f}")
        for provider, window in sorted(self._sources.loop.settle_windows().items()):
            if not window.get("settled") and window.get("until") is not None:
                gates.append(
                    f"provider {provider!r}: settle window until {window['until']:.1f} (rejoin_settle "
                    f"{window['settle_s']:g} s): machines not joined are not retired before it"
                )
        return gates

    def _document(
        self, inputs: _Inputs, answer: tuple[Explanation, list[dict[str, Any]]], what_if: bool
    ) -> dict[str, Any]:
        explanation, items = answer
        return {
            "ok": True,
            "what_if": what_if,
            "now": explanation.now,
            "gates": self._gates(inputs),
            "items": items,
            "actions": list(explanation.actions),
            "notes": list(explanation.notes),
        }

    # --- uploads ------------------------------------------------------------------------------------------------

    def _receive(self, request: dict[str, Any]) -> tuple[str | None, str]:
        """The whole document once its last part is in (``None`` while more parts are to come), and the upload."""
        part, more, token = request.get("part"), request.get("more", False), request.get("upload")
        if not isinstance(part, str) or not isinstance(more, bool):
            raise Refused("part must be a string (the document's text) and more a boolean")
        now = self._clock()
        for key, kept in list(self._uploads.items()):
            if now - kept.started > UPLOAD_TTL:
                del self._uploads[key]
        if token is None:
            if not more:
                return part, ""
            while len(self._uploads) >= MAX_UPLOADS:
                self._uploads.pop(next(iter(self._uploads)))
            token = secrets.token_hex(8)
            self._uploads[token] = _Upload([], 0, now)
        upload = self._uploads.get(token) if isinstance(token, str) else None
        if upload is None:
            raise Refused("upload expired or unknown: send the document again from its first part")
        upload.parts.append(part)
        upload.size += len(part)
        if upload.size > MAX_UPLOAD:
            del self._uploads[token]
            raise Refused(f"the what-if document is larger than {MAX_UPLOAD} bytes")
        if more:
            return None, token
        del self._uploads[token]
        return "".join(upload.parts), token
