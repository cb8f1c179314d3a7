"""The demand phase of a plan: serve each item's deficit by reuse, then by requests, under caps and the step limit.

Pure; part of :func:`provisionerd.planner.plan.plan`. Per item: it keeps ``min(active, count)`` of its machines and
``deficit = count - kept - outstanding``. A deficit is filled first from the *idle pool* (idle machines other items
do not need, on offers compatible with this item, cheapest offer first), then by requests over the item's
compatible offers in choice order, skipping offers that are out of capacity, on a throttled or paused provider, at
``maxNumber``, at the provider cap or at the provider's own step limit (``policy.of(provider)``), and spilling over
to the next offer when one fills. Items are served in demand_id order, so a binding step limit or cap favours lower
ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

import attrs

from provisionerd.domain.actions import Note
from provisionerd.domain.model import DemandItem, Offer
from provisionerd.planner import unmet_rules
from provisionerd.planner.idle_pool import IdlePool
from provisionerd.planner.offers import Catalog, OfferKey, ParsedOffer, Rejection, Requirement, requirement_of
from provisionerd.planner.policy import Policy
from provisionerd.planner.state import PlannerState, ramp_step
from provisionerd.planner.supply import IdleEntry, Tally

#: Reasons an ``unmet_demand`` note names at most (the decision keeps them all: ``provisionerd explain``).
NOTE_REASONS = 3


@attrs.frozen
class DemandDecision:
    """How one item with a deficit was served: for logs, events and tests.

    ``requested`` lists ``(offer, machines)`` in the order tried; ``unmet`` is what is still missing.
    ``blocked`` names compatible offers skipped now (capacity back-off, throttle, pause, maxNumber, provider cap)
    and ``incompatible`` every offer :func:`provisionerd.planner.offers.compatibility_reasons` rejects (a tuple shared
    with the catalog's cache); :attr:`rejected` merges both in offer-id order. ``filled`` names the offers this
    plan asked for less than the deficit left, and the limit that bound each (``maxNumber``, ``max_machines``, the
    provider's or the global step limit), with its figures; ``untried`` lists the compatible offers never looked at
    because the global step window was full, and ``held(key)`` says what would stop such an offer once the window
    frees room (a back-off, ``max_machines N/N``...; ``None``: nothing). None of them changes a decision: they say
    why (``provisionerd explain``), so that a full step window does not hide a cap.
    """

    demand_id: str
    wanted: int
    active: int
    outstanding: int
    reused: int
    requested: tuple[tuple[OfferKey, int], ...]
    unmet: int
    blocked: tuple[Rejection, ...]
    incompatible: tuple[Rejection, ...] = attrs.field(repr=lambda r: f"<{len(r)} offers>")
    filled: tuple[Rejection, ...] = ()
    untried: tuple[ParsedOffer, ...] = attrs.field(default=(), repr=lambda r: f"<{len(r)} offers>")
    held: Callable[[OfferKey], str | None] = attrs.field(default=lambda _key: None, eq=False, repr=False)

    @property
    def rejected(self) -> tuple[Rejection, ...]:
        """Every offer not used, and why, in offer-id order (computed on demand: it can be 1,000 entries)."""
        return tuple(sorted((*self.blocked, *self.incompatible), key=lambda r: (r.provider, r.template_id)))


def excess_pool(
    counts: Tally, items: Mapping[str, DemandItem], policy: Policy | None = None, lend: Collection[str] = ()
) -> IdlePool:
    """Idle machines beyond what their own item keeps, per offer (:class:`IdlePool`). The ones given away are the
    first in ``Policy.surplus_key`` order (the highest priority number, then the longest idle). Every idle machine
    of an item in ``lend`` is in the pool (warm headroom: lent first, ``planner.headroom.settle_pool`` takes back
    what nobody borrowed). An item whose idle machines are all of one offer (``Tally.idle_offer``) gives its surplus
    as one slice, without reading its machines."""
    pool = IdlePool()
    ranked = policy is not None and bool(policy.priorities)
    for demand_id, idles in counts.idle.items():
        item = items.get(demand_id)
        excess = counts.active.get(demand_id, 0) - (max(item.count, 0) if item is not None else 0)
        if demand_id in lend:
            excess = len(idles)
        if excess <= 0:
            continue
        given: Sequence[IdleEntry]
        if ranked:
            assert policy is not None
            given = sorted(idles, key=lambda e: policy.surplus_key(e[2].provider, e[0], e[1], e[2].template_id))
            given = sorted(given[:excess])  # a run is longest idle first (IdlePool)
        else:  # the tally lists them longest idle first, ties by machine id (Tally.idle)
            key = counts.idle_offer.get(demand_id)
            if key is not None:
                pool.add(key, idles, excess)  # the head of the kept list, not a copy
                continue
            given = idles[:excess]
        split: dict[OfferKey, list[IdleEntry]] = {}
        for entry in given:
            machine = entry[2]
            split.setdefault((machine.provider, machine.template_id), []).append(entry)
        for key, run in split.items():
            pool.add(key, run)
    return pool


class Allocator:
    """The demand phase of one plan call: reuse, then requests, under caps and the step limit."""

    def __init__(
        self,
        state: PlannerState,
        catalog: Catalog,
        counts: Tally,
        now: float,
        policy: Policy,
        blocked: Mapping[str, str] | None = None,
    ) -> None:
        """``blocked``: providers no request may go to this pass, and why (``planner.health``'s protection)."""
        self.catalog, self.counts, self.now, self.policy = catalog, counts, now, policy
        self.blocked: Mapping[str, str] = blocked or {}
        self.capacity = state.capacity
        self.step_log = tuple(e for e in state.step_log if e[0] > now - policy.step_interval)
        self.ramps = state.ramps
        # The global limit grows by what the providers' ramps added above their floors (the daemon's global limit
        # is the sum of the providers' own: it must not hold back a step that doubled).
        grown = 0
        for provider in state.ramps:
            step, floor = ramp_step(state.ramps, provider, policy), policy.of(provider).step_limit
            if step is not None and floor is not None:
                grown += step - floor
        #: The global step limit of this pass (the window's whole room when nothing was asked in it).
        self.step_limit = policy.step_limit + grown
        self.step_room = self.step_limit - sum(e[2] for e in self.step_log)
        #: Providers whose own step had no room left for the demand that wanted them (``ramp.Planned.used_all``).
        self.saturated: set[str] = set()
        self.provider_load = counts.provider_load()
        self.requests: list[tuple[str, OfferKey, int]] = []  # (demand_id, offer, count)
        self.decisions: list[DemandDecision] = []
        self._provider_room: dict[str, int | None] = {}  # provider -> its own step room (None: no own limit)
        #: provider -> offer attribute -> what its machines (live + requested + returning) add up to, for the
        #: providers with resource limits (``ProviderPolicy.resource_limits``), read on first use.
        self._resource_use: dict[str, dict[str, float]] = {}
        self._pool: IdlePool | None = None  # the pool _pool_order was found for
        self._pool_order: dict[Requirement, list[OfferKey]] = {}

    def _room_of(self, provider: str) -> int | None:
        """What ``provider``'s own step limit leaves in this window (``None``: it has none)."""
        if provider in self._provider_room:
            return self._provider_room[provider]
        limit = ramp_step(self.ramps, provider, self.policy)
        room = None if limit is None else limit - sum(e[2] for e in self.step_log if e[1] == provider)
        self._provider_room[provider] = room
        return room

    def _reusable(self, requirement: Requirement, pool: IdlePool) -> list[OfferKey]:
        """The pool's offers compatible with ``requirement``, cheapest first: found once per requirement and pool
        (a pool's offers never change while items take from it; many items share a requirement)."""
        if pool is not self._pool:
            self._pool, self._pool_order = pool, {}
        found = self._pool_order.get(requirement)
        if found is None:
            rank = self.catalog.rank_index(requirement)
            found = self._pool_order[requirement] = sorted((k for k in pool.keys() if k in rank), key=rank.__getitem__)
        return found

    def serve(
        self,
        item: DemandItem,
        pool: IdlePool,
        notes: list[Note],
        requirement_of: Callable[[DemandItem], Requirement] = requirement_of,
    ) -> None:
        """Serve ``item``'s deficit, if it has one. ``requirement_of`` may be a cached one (see demand_index)."""
        active = self.counts.active.get(item.demand_id, 0)
        outstanding = self.counts.outstanding.get(item.demand_id, 0)
        wanted = max(item.count, 0)
        deficit = wanted - min(active, wanted) - outstanding
        if deficit <= 0:
            return
        requirement = requirement_of(item)
        compatible, incompatible = self.catalog.ranking(requirement)
        if item.all_or_nothing:
            self._serve_whole(item, pool, compatible, incompatible, (wanted, active, outstanding, deficit), notes)
            return
        reused = 0
        if pool:  # reuse before buying: idle machines of compatible offers, cheapest offer first
            for key in self._reusable(requirement, pool):
                entries = pool.entries(key)
                while entries and deficit > 0:
                    entries.pop()
                    reused += 1
                    deficit -= 1
                if not deficit:
                    break
        blocked: list[Rejection] = []
        requested: list[tuple[OfferKey, int]] = []
        filled: list[Rejection] = []
        tried = 0
        for parsed in compatible:
            if deficit <= 0 or self.step_room <= 0:
                break
            tried += 1
            key = parsed.key
            why = self.blocked.get(key[0]) or self.capacity.offer_block(key, self.now) or self._full(key, parsed.offer)
            if why is not None:
                blocked.append(Rejection(key[0], key[1], (why,)))
                continue
            room = parsed.offer.max_number - self.counts.load.get(key, 0)
            cap = self.policy.of(key[0]).max_machines
            if cap is not None:
                room = min(room, cap - self.provider_load.get(key[0], 0))
            fits = self._resource_room(parsed)[0]
            if fits is not None:
                room = min(room, fits)
            own_room = self._room_of(key[0])
            if own_room is not None:
                room = min(room, own_room)
                left = own_room - min(room, deficit, self.step_room)
                self._provider_room[key[0]] = left
                if left <= 0:
                    self.saturated.add(key[0])
            count = min(room, deficit, self.step_room)
            if count < deficit:
                filled.append(Rejection(key[0], key[1], (self._bound(key, parsed.offer, count, own_room),)))
            self.counts.load[key] = self.counts.load.get(key, 0) + count
            self.provider_load[key[0]] = self.provider_load.get(key[0], 0) + count
            self._add_use(parsed, count)
            self.step_room -= count
            deficit -= count
            requested.append((key, count))
            self.requests.append((item.demand_id, key, count))
        untried = compatible[tried:] if deficit > 0 and self.step_room <= 0 else ()
        if deficit > 0:
            if not compatible:
                detail = f"{deficit} machine(s) not requested: no compatible offer ({len(incompatible)} incompatible)"
                if incompatible:
                    detail += f", e.g. {incompatible[0].describe()}"
                rules: tuple[str, ...] = (unmet_rules.INCOMPATIBLE,)
            else:
                why = "step limit reached" if self.step_room <= 0 else "no eligible offer with room"
                stops = [*filled, *blocked]
                for parsed in untried[: max(NOTE_REASONS - len(stops), 0)]:
                    held = self.held(parsed.key)
                    if held is not None:
                        stops.append(Rejection(parsed.key[0], parsed.key[1], (f"then {held}",)))
                detail = f"{deficit} machine(s) not requested: {why}"
                if stops:
                    detail += "; " + "; ".join(r.describe() for r in stops[:NOTE_REASONS])
                window = ("step limit reached",) if self.step_room <= 0 else ()
                rules = unmet_rules.rules_of((*window, *(reason for r in stops for reason in r.reasons)))
            notes.append(Note("unmet_demand", detail, demand_id=item.demand_id, rules=rules))
        self.decisions.append(
            DemandDecision(
                item.demand_id,
                wanted,
                active,
                outstanding,
                reused,
                tuple(requested),
                deficit,
                tuple(blocked),
                incompatible,
                tuple(filled),
                untried,
                self.held,
            )
        )

    def _serve_whole(
        self,
        item: DemandItem,
        pool: IdlePool,
        compatible: tuple[ParsedOffer, ...],
        incompatible: tuple[Rejection, ...],
        figures: tuple[int, int, int, int],
        notes: list[Note],
    ) -> None:
        """An all-or-nothing item (``planner.gang``): its whole deficit from the first compatible offer that holds
        all of it (its idle machines in ``pool`` first, then one request for the rest), or nothing and a note
        naming what held each offer. Never two offers."""
        wanted, active, outstanding, deficit = figures
        blocked: list[Rejection] = []
        filled: list[Rejection] = []
        chosen: ParsedOffer | None = None
        reused = need = 0
        for parsed in compatible:
            key = parsed.key
            reused = min(pool.count(key), deficit)
            need = deficit - reused
            if not need:
                chosen = parsed
                break
            why = self.blocked.get(key[0]) or self.capacity.offer_block(key, self.now) or self._full(key, parsed.offer)
            if why is not None:
                blocked.append(Rejection(key[0], key[1], (why,)))
                continue
            short = self._short_of(parsed, need)
            if short is not None:
                filled.append(Rejection(key[0], key[1], (short,)))
                continue
            chosen = parsed
            break
        requested: tuple[tuple[OfferKey, int], ...] = ()
        if chosen is not None:
            key = chosen.key
            entries = pool.entries(key) if reused else None
            if entries and reused:
                del entries[len(entries) - reused :]  # the most recently idle go first, as in serve
            if need:
                self.counts.load[key] = self.counts.load.get(key, 0) + need
                self.provider_load[key[0]] = self.provider_load.get(key[0], 0) + need
                self._add_use(chosen, need)
                self.step_room -= need
                own_room = self._room_of(key[0])
                if own_room is not None:
                    self._provider_room[key[0]] = own_room - need
                    if own_room - need <= 0:
                        self.saturated.add(key[0])
                requested = ((key, need),)
                self.requests.append((item.demand_id, key, need))
        else:
            reused = 0
            stops = [*filled, *blocked]
            if not compatible:
                detail = f"{deficit} machine(s) not requested: all or nothing, and no compatible offer"
                detail += f" ({len(incompatible)} incompatible)"
                if incompatible:
                    detail += f", e.g. {incompatible[0].describe()}"
                rules: tuple[str, ...] = (unmet_rules.INCOMPATIBLE,)
            else:
                detail = f"{deficit} machine(s) not requested: all or nothing, and no offer has room for all {deficit}"
                if stops:
                    detail += "; " + "; ".join(r.describe() for r in stops[:NOTE_REASONS])
                rules = unmet_rules.rules_of(reason for r in stops for reason in r.reasons)
            notes.append(Note("unmet_demand", detail, demand_id=item.demand_id, rules=rules))
        self.decisions.append(
            DemandDecision(
                item.demand_id,
                wanted,
                active,
                outstanding,
                reused,
                requested,
                0 if chosen is not None else deficit,
                tuple(blocked),
                incompatible,
                tuple(filled),
                (),
                self.held,
            )
        )

    def _short_of(self, parsed: ParsedOffer, count: int) -> str | None:
        """Which limit leaves offer ``parsed`` less room than ``count`` machines at once, with its figures
        (``None``: all of them fit). A step limit smaller than ``count`` is met by an empty window."""
        key, offer = parsed.key, parsed.offer
        load = self.counts.load.get(key, 0)
        if load + count > offer.max_number:
            return f"template at maxNumber {offer.max_number} ({load} live or requested, {count} wanted at once)"
        own = self.policy.of(key[0])
        provider_load = self.provider_load.get(key[0], 0)
        if own.max_machines is not None and provider_load + count > own.max_machines:
            return f"max_machines {provider_load}/{own.max_machines} (provider cap; {count} wanted at once)"
        fits, name = self._resource_room(parsed)
        if fits is not None and fits < count:
            return f"{name}: room for {fits} machine(s) of this template (provider limit; {count} wanted at once)"
        own_room, step = self._room_of(key[0]), ramp_step(self.ramps, key[0], self.policy)
        if own_room is not None and step is not None and own_room < min(count, step):
            interval = self.policy.step_interval
            return f"provider step limit {step} per {interval:g}s has room for {own_room} ({count} wanted at once)"
        if self.step_room < min(count, self.step_limit):
            interval = self.policy.step_interval
            return f"step limit {self.step_limit} per {interval:g}s has room for {self.step_room} (global)"
        return None

    def held(self, key: OfferKey) -> str | None:
        """What would stop a request to offer ``key`` now, were there step room (read only: no decision changes;
        once the global step window is full nothing more is requested in this plan, so the answer is final)."""
        parsed = self.catalog.by_key.get(key)
        if parsed is None:
            return None
        return (
            self.blocked.get(key[0]) or self.capacity.offer_block(key, self.now) or self._limits(key, parsed.offer)[0]
        )

    def _bound(self, key: OfferKey, offer: Offer, count: int, own_room: int | None) -> str:
        """Which limit held offer ``key``'s request to ``count`` (read after it is counted), with its figures."""
        load = self.counts.load.get(key, 0) + count
        if load >= offer.max_number:
            return f"template at maxNumber {offer.max_number} ({load} live or requested)"
        own = self.policy.of(key[0])
        provider_load = self.provider_load.get(key[0], 0) + count
        if own.max_machines is not None and provider_load >= own.max_machines:
            return f"max_machines {provider_load}/{own.max_machines} (provider cap reached)"
        parsed = self.catalog.by_key.get(key)
        limit = None if parsed is None else self._resource_limit_reached(parsed, count)
        if limit is not None:
            return limit
        if own_room is not None and count >= own_room:
            step = ramp_step(self.ramps, key[0], self.policy)
            return f"provider step limit {step} per {self.policy.step_interval:g}s reached"
        return f"step limit {self.policy.step_limit} per {self.policy.step_interval:g}s reached (global)"

    def _full(self, key: OfferKey, offer: Offer) -> str | None:
        why, saturated = self._limits(key, offer)
        if saturated:
            self.saturated.add(key[0])
        return why

    def _limits(self, key: OfferKey, offer: Offer) -> tuple[str | None, bool]:
        """Why offer ``key`` is full now (``maxNumber``, ``max_machines``, its provider's own step), and whether it
        is its provider's step that is (the caller marks the provider saturated)."""
        load = self.counts.load.get(key, 0)
        if load >= offer.max_number:
            return f"template at maxNumber {offer.max_number} ({load} live or requested)", False
        own = self.policy.of(key[0])
        if own.max_machines is not None and self.provider_load.get(key[0], 0) >= own.max_machines:
            return f"max_machines {self.provider_load.get(key[0], 0)}/{own.max_machines} (provider cap reached)", False
        parsed = self.catalog.by_key.get(key)
        limit = None if parsed is None else self._resource_limit_reached(parsed, 0)
        if limit is not None:
            return limit, False
        room = self._room_of(key[0])
        if room is not None and room <= 0:
            step = ramp_step(self.ramps, key[0], self.policy)
            return f"provider step limit {step} per {self.policy.step_interval:g}s reached", True
        return None, False

    # --- resource limits (``ProviderPolicy.max_gpus`` / ``max_ncpus`` / ``max_mem_mb``) ---------------------------

    def _use_of(self, provider: str) -> dict[str, float]:
        """What ``provider``'s machines add up to, per limited attribute (each machine counted from its template;
        one whose template is no longer offered has an unknown size and adds nothing)."""
        use = self._resource_use.get(provider)
        if use is None:
            use = {attribute: 0.0 for _, attribute, _ in self.policy.of(provider).resource_limits}
            if use:
                for key, n in self.counts.load.items():
                    parsed = self.catalog.by_key.get(key) if key[0] == provider and n else None
                    if parsed is not None:
                        for attribute in use:
                            use[attribute] += n * (getattr(parsed, attribute) or 0.0)
            self._resource_use[provider] = use
        return use

    def _add_use(self, parsed: ParsedOffer, count: int) -> None:
        if count and self.policy.of(parsed.key[0]).resource_limits:
            use = self._use_of(parsed.key[0])
            for attribute in use:
                use[attribute] += count * (getattr(parsed, attribute) or 0.0)

    def _resource_room(self, parsed: ParsedOffer, extra: int = 0) -> tuple[int | None, str]:
        """How many more machines of ``parsed`` (beyond ``extra`` more already counted) its provider's resource
        limits let in, and the limit that binds (``None``: no limit applies to this offer's machines)."""
        limits = self.policy.of(parsed.key[0]).resource_limits
        if not limits:
            return None, ""
        use = self._use_of(parsed.key[0])
        room: int | None = None
        bound = ""
        for name, attribute, limit in limits:
            per = getattr(parsed, attribute) or 0.0
            if per <= 0:
                continue
            fits = max(0, math.floor((limit - use[attribute] - extra * per) / per + 1e-9))
            if room is None or fits < room:
                room, bound = fits, name
        return room, bound

    def _resource_limit_reached(self, parsed: ParsedOffer, extra: int) -> str | None:
        """Why no further machine of ``parsed`` fits its provider's resource limits (after ``extra`` more), with the
        figures: ``max_gpus 8/8 (provider limit; a machine of this template has 4)``; ``None``: one more fits."""
        room, name = self._resource_room(parsed, extra)
        if room is None or room > 0:
            return None
        attribute = dict((n, a) for n, a, _ in self.policy.of(parsed.key[0]).resource_limits)[name]
        limit = getattr(self.policy.of(parsed.key[0]), name)
        used = self._use_of(parsed.key[0])[attribute] + extra * (getattr(parsed, attribute) or 0.0)
        per = getattr(parsed, attribute) or 0.0
        return f"{name} {used:g}/{limit} (provider limit; a machine of this template has {per:g})"
