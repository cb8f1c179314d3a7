"""Offer compatibility and choice: which provider templates can serve a demand item, and which one is cheapest.

Pure and synchronous. One function, :func:`compatibility_reasons`, decides whether an offer satisfies a demand item
and explains every reason it does not; the planner, the logs and the tests all use it.

How an offer's LSF-style attributes are read (``Offer.attributes`` is ``{name: (kind, value)}``):

================  ==========================  ==================================================================
demand field      offer attribute              rule
================  ==========================  ==================================================================
``ncpus``         ``ncpus`` (Numeric)          offer >= wanted; undeclared counts as 1 (every machine has a CPU)
``mem_mb``        ``mem`` (Numeric, MiB)       offer >= wanted; undeclared only satisfies 0
``gpus``          ``ngpus`` (Numeric)          offer >= wanted; undeclared counts as 0
``gpu_type``      ``gputype`` (String)         equal, ignoring case; only checked when set
``arch``          ``type`` (String, LSF)       equal, ignoring case (``x86_64`` matches ``X86_64``)
``attributes``    same name                    equal text, exactly
``placement``     same name                    equal text, exactly (placement constraints are attributes too)
``providers``     ``Offer.provider``           the offer's provider is listed (empty list = any provider)
``max_hourly``    ``Offer.price``              with a cap: priced per ``hour``, finite, and ``amount <= cap``;
``_cost``                                      an unpriced offer is rejected. Without a cap price never rejects.
================  ==========================  ==================================================================

A cap compares like with like: a quote counts only per ``hour``, and when the item names the cap's currency
(``DemandItem.cost_currency``) an offer quoted in another currency is rejected, never converted. An item with a
cap and no currency compares amounts alone (as before currencies were named: one currency per cluster).

Choice order (:func:`offer_sort_key`): the provider's priority first (lower first: ``ProviderPolicy.priority``,
0 for every provider unless configured), then within one priority priced offers first, cheapest ``amount`` first;
ties, and the unpriced offers after all priced ones, are ordered by offer id ``(provider, template_id)``. A price
that is negative, non-finite or not per hour counts as unpriced. An offer of a higher priority number is used only
when every offer before it is full, backed off, unhealthy or incompatible (the allocator takes offers in this order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import attrs

from provisionerd.domain.model import DemandItem, Offer, ResourceShape

#: An offer's identity: ``(provider, template_id)``. This is also the tie-break order.
OfferKey = tuple[str, str]


def offer_key(offer: Offer) -> OfferKey:
    return (offer.provider, offer.template_id)


def format_key(key: OfferKey) -> str:
    return f"{key[0]}/{key[1]}"


@attrs.frozen
class ParsedOffer:
    """An offer with its attributes read once (1,000 templates are checked against many demand items)."""

    offer: Offer
    ncpus: float | None
    mem_mb: float | None
    gpus: float | None
    gpu_type: str | None  # lower-cased
    arch: str | None  # lower-cased
    price: float | None  # per hour; None = unpriced (or unusable quote)
    problems: tuple[str, ...]  # attributes that could not be read, reported as rejection reasons

    @property
    def key(self) -> OfferKey:
        return (self.offer.provider, self.offer.template_id)


def _numeric(offer: Offer, name: str, problems: list[str]) -> float | None:
    entry = offer.attributes.get(name)
    if entry is None:
        return None
    try:
        value = float(entry[1])
    except (TypeError, ValueError, IndexError):
        problems.append(f"{name} value {entry!r} is not a number")
        return None
    if not math.isfinite(value):
        problems.append(f"{name} value {entry[1]!r} is not finite")
        return None
    return value


def _text(offer: Offer, name: str) -> str | None:
    entry = offer.attributes.get(name)
    return None if entry is None else str(entry[1]).lower()


def parse_offer(offer: Offer) -> ParsedOffer:
    problems: list[str] = []
    price = None
    quote = offer.price
    if quote is not None and quote.unit == "hour" and math.isfinite(quote.amount) and quote.amount >= 0:
        price = float(quote.amount)
    return ParsedOffer(
        offer=offer,
        ncpus=_numeric(offer, "ncpus", problems),
        mem_mb=_numeric(offer, "mem", problems),
        gpus=_numeric(offer, "ngpus", problems),
        gpu_type=_text(offer, "gputype"),
        arch=_text(offer, "type"),
        price=price,
        problems=tuple(problems),
    )


def offer_sort_key(parsed: ParsedOffer, priority: int = 0) -> tuple[int, int, float, str, str]:
    """Lower ``priority`` first; within one, cheapest known price first, then offer id; unpriced offers after every
    priced one of their priority, by offer id."""
    if parsed.price is None:
        return (priority, 1, 0.0, parsed.offer.provider, parsed.offer.template_id)
    return (priority, 0, parsed.price, parsed.offer.provider, parsed.offer.template_id)


@attrs.frozen(cache_hash=True)
class Requirement:
    """Everything about a demand item that decides compatibility (its count does not); hashable, for caching (the
    hash computed once per object: every serve looks its requirement up in the catalog's caches)."""

    ncpus: int
    mem_mb: int
    gpus: int
    gpu_type: str | None  # lower-cased
    arch: str | None  # lower-cased
    attributes: tuple[tuple[str, str], ...]
    cap: float | None
    providers: tuple[str, ...]
    placement: tuple[tuple[str, str], ...]
    currency: str | None = None  # the cap's currency, upper-cased (None: unchecked)
    templates: tuple[str, ...] = ()  # only these template ids (empty: any; ``DemandItem.templates``)
    all_or_nothing: bool = False  # only providers that launch all or nothing (``planner.gang``)


@attrs.frozen
class PinnedItem(DemandItem):
    """A demand item of the daemon's own that only ``templates`` may serve (never on the wire: warm headroom,
    ``planner.headroom``)."""

    templates: tuple[str, ...] = ()


def requirement_of(item: DemandItem | ResourceShape) -> Requirement:
    """The hashable part of ``item`` that compatibility depends on."""
    shape: ResourceShape
    cap: float | None
    providers: tuple[str, ...]
    placement: Mapping[str, str]
    currency = None
    templates: tuple[str, ...] = ()
    whole = False
    if isinstance(item, ResourceShape):
        shape, cap, providers, placement = item, None, (), {}
    else:
        shape, cap, providers, placement = item.shape, item.max_hourly_cost, item.providers, item.placement
        currency = item.cost_currency.upper() or None
        whole = item.all_or_nothing
        if isinstance(item, PinnedItem):
            templates = tuple(sorted(set(item.templates)))
    return Requirement(
        ncpus=shape.ncpus,
        mem_mb=shape.mem_mb,
        gpus=shape.gpus,
        gpu_type=shape.gpu_type.lower() if shape.gpu_type else None,
        arch=shape.arch.lower() if shape.arch else None,
        attributes=tuple(sorted(shape.attributes.items())),
        cap=cap,
        providers=tuple(sorted(set(providers))),
        placement=tuple(sorted(placement.items())),
        currency=currency,
        templates=templates,
        all_or_nothing=whole,
    )


def cluster_cost(
    requirement: Callable[[DemandItem], Requirement], cap: float | None, currency: str, item: DemandItem
) -> Requirement:
    """``requirement(item)`` under the cluster's ``[cost]``: its cap when the item has none, its currency when
    the item's cap names none. The item's own cap and currency win."""
    req = requirement(item)
    own_cap = req.cap if req.cap is not None else cap
    own_currency = req.currency or currency.upper() or None
    if own_cap == req.cap and own_currency == req.currency:
        return req
    return attrs.evolve(req, cap=own_cap, currency=own_currency)


def _fmt(value: float) -> str:
    return f"{value:g}"


def reasons_for(req: Requirement, parsed: ParsedOffer) -> tuple[str, ...]:
    """Every reason ``parsed`` cannot serve ``req`` (empty = compatible). See the module table for the rules."""
    offer = parsed.offer
    reasons: list[str] = list(parsed.problems)
    if req.providers and offer.provider not in req.providers:
        reasons.append(f"provider {offer.provider!r} not in allowed providers {list(req.providers)!r}")
    if req.templates and offer.template_id not in req.templates:
        reasons.append(f"template {offer.template_id!r} not in allowed templates {list(req.templates)!r}")
    have_cpus = 1.0 if parsed.ncpus is None else parsed.ncpus
    if have_cpus < req.ncpus:
        reasons.append(f"ncpus {_fmt(have_cpus)} < {req.ncpus} required")
    if req.mem_mb > 0 and (parsed.mem_mb is None or parsed.mem_mb < req.mem_mb):
        have = "undeclared" if parsed.mem_mb is None else f"{_fmt(parsed.mem_mb)} MiB"
        reasons.append(f"mem {have} < {req.mem_mb} MiB required")
    have_gpus = 0.0 if parsed.gpus is None else parsed.gpus
    if have_gpus < req.gpus:
        reasons.append(f"ngpus {_fmt(have_gpus)} < {req.gpus} required")
    if req.gpu_type is not None and parsed.gpu_type != req.gpu_type:
        reasons.append(f"gputype {parsed.gpu_type!r} != {req.gpu_type!r} required")
    if req.arch is not None and parsed.arch != req.arch:
        reasons.append(f"type (arch) {parsed.arch!r} != {req.arch!r} required")
    for label, constraints in (("attribute", req.attributes), ("placement", req.placement)):
        for name, wanted in constraints:
            entry = offer.attributes.get(name)
            if entry is None:
                reasons.append(f"{label} {name} undeclared ({wanted!r} required)")
            elif str(entry[1]) != wanted:
                reasons.append(f"{label} {name} {entry[1]!r} != {wanted!r} required")
    if req.cap is not None:
        if not (math.isfinite(req.cap) and req.cap >= 0):
            reasons.append(f"cost cap {req.cap!r} is not a finite non-negative number")
        elif parsed.price is None:
            quote = offer.price
            why = "unpriced" if quote is None else f"unusable price quote {quote.amount!r}/{quote.unit}"
            reasons.append(f"{why} offer rejected under cost cap {_fmt(req.cap)}/hour")
        elif req.currency is not None and offer.price is not None and offer.price.currency.upper() != req.currency:
            quoted = offer.price.currency[:16]
            reasons.append(f"price in {quoted!r}, cost cap in {req.currency!r}: currencies are never compared")
        elif parsed.price > req.cap:
            reasons.append(f"price {_fmt(parsed.price)}/hour above cost cap {_fmt(req.cap)}/hour")
    return tuple(reasons)


def gang_unsupported(provider: str) -> str:
    """Why an offer of ``provider`` cannot serve an all-or-nothing item: its plugin cannot launch all or nothing
    (``Catalog.gang``; ``planner.gang``)."""
    return (
        f"provider {provider!r} cannot launch all or nothing (its plugin does not declare features.allOrNothing;"
        " the legacy LSF contract has no way to say it)"
    )


def compatibility_reasons(item: DemandItem | ResourceShape, offer: Offer) -> tuple[str, ...]:
    """Why ``offer`` cannot serve ``item``: empty when compatible.

    ``item`` is a demand item (shape, provider restriction, placement and cost cap all apply) or a bare shape.
    """
    return reasons_for(requirement_of(item), parse_offer(offer))


@attrs.frozen
class Rejection:
    """One offer not chosen, and every reason why (for logs and events)."""

    provider: str
    template_id: str
    reasons: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.provider}/{self.template_id}: " + "; ".join(self.reasons)


@attrs.frozen
class OfferChoice:
    """The outcome of choosing for one demand item.

    ``chosen`` is the offer to use (``None`` when nothing is eligible); ``eligible`` lists every eligible offer in
    preference order (``chosen`` first) so a caller can fall through; ``rejected`` names every other offer with
    its reasons, in offer-id order.
    """

    demand_id: str
    chosen: Offer | None
    eligible: tuple[Offer, ...]
    rejected: tuple[Rejection, ...]

    def describe(self) -> str:
        head = "none eligible" if self.chosen is None else f"chose {format_key(offer_key(self.chosen))}"
        return f"demand {self.demand_id}: {head}" + "".join(f"\n  rejected {r.describe()}" for r in self.rejected)


class Catalog:
    """Parsed offers, indexed by key, with per-requirement rankings cached.

    Build one per offer refresh and hand it to :func:`provisionerd.planner.plan.plan` repeatedly. Duplicate offer
    ids keep the first offer and are listed in ``duplicates``.
    """

    def __init__(
        self,
        offers: Iterable[Offer],
        priorities: Mapping[str, int] | None = None,
        template_priorities: Mapping[OfferKey, int] | None = None,
        unverified: Iterable[OfferKey] = (),
        gang: Iterable[str] = (),
    ) -> None:
        """``priorities``: each provider's priority (``Policy.priorities``; a provider not named is 0);
        ``template_priorities``: a template's own, which replaces its provider's (``Policy.template_priorities``);
        ``unverified``: the templates whose machines' capability reports are not checked (``Policy.unverified``;
        ``(provider, "*")``: all of that provider's); ``gang``: the providers whose plugins launch all or nothing
        (``features.allOrNothing``), the only ones an all-or-nothing item may use (``planner.gang``)."""
        self.priorities: dict[str, int] = dict(priorities or {})
        self.gang: frozenset[str] = frozenset(gang)
        self.unverified: frozenset[OfferKey] = frozenset(unverified)
        self.template_priorities: dict[OfferKey, int] = dict(template_priorities or {})
        self.by_key: dict[OfferKey, ParsedOffer] = {}
        duplicates: list[OfferKey] = []
        for offer in offers:
            key = offer_key(offer)
            if key in self.by_key:
                duplicates.append(key)
                continue
            self.by_key[key] = parse_offer(offer)
        self.duplicates = tuple(duplicates)
        self.ordered = tuple(sorted(self.by_key.values(), key=lambda p: offer_sort_key(p, self.priority_of(p.key))))
        self._rankings: dict[Requirement, tuple[tuple[ParsedOffer, ...], tuple[Rejection, ...]]] = {}
        #: instance_ref -> (the host state judged, why it falls short of its template): a host is judged once per
        #: state and catalog (``planner.health``; the plan checks identity, so a changed host is judged again).
        self.verdicts: dict[str, tuple[object, tuple[str, ...]]] = {}
        self._rank_index: dict[Requirement, dict[OfferKey, int]] = {}

    def verified(self, key: OfferKey) -> bool:
        """Whether the machines of offer ``key`` must confirm its template by their report (``planner.health``)."""
        return not self.unverified or (key not in self.unverified and (key[0], "*") not in self.unverified)

    def priority_of(self, key: OfferKey) -> int:
        """Offer ``key``'s priority: its template's own, else its provider's, else 0."""
        found = self.template_priorities.get(key)
        return found if found is not None else self.priorities.get(key[0], 0)

    def __len__(self) -> int:
        return len(self.by_key)

    def ranking(self, req: Requirement) -> tuple[tuple[ParsedOffer, ...], tuple[Rejection, ...]]:
        """``(compatible offers in choice order, rejections of the others in offer-id order)``, cached."""
        cached = self._rankings.get(req)
        if cached is None:
            compatible: list[ParsedOffer] = []
            rejected: list[Rejection] = []
            for parsed in self.ordered:
                reasons = reasons_for(req, parsed)
                if req.all_or_nothing and parsed.offer.provider not in self.gang:
                    reasons = (*reasons, gang_unsupported(parsed.offer.provider))
                if reasons:
                    rejected.append(Rejection(parsed.offer.provider, parsed.offer.template_id, reasons))
                else:
                    compatible.append(parsed)
            rejected.sort(key=lambda r: (r.provider, r.template_id))
            cached = (tuple(compatible), tuple(rejected))
            if len(self._rankings) >= 4096:  # bounded memory when demand shapes churn
                self._rankings.clear()
                self._rank_index.clear()
            self._rankings[req] = cached
        return cached

    def rank_index(self, req: Requirement) -> dict[OfferKey, int]:
        """``{compatible offer key: position in choice order}`` for ``req``, cached."""
        index = self._rank_index.get(req)
        if index is None:
            index = {parsed.key: i for i, parsed in enumerate(self.ranking(req)[0])}
            self._rank_index[req] = index
        return index


def choose_offer(
    item: DemandItem,
    offers: Iterable[Offer] | Catalog,
    unavailable: Mapping[OfferKey, str] = {},  # noqa: B006 - read only
) -> OfferChoice:
    """Choose the offer for ``item``: the cheapest compatible one that is not ``unavailable``.

    ``unavailable`` maps offer keys to the reason they cannot be used now (capacity back-off, paused or throttled
    provider, template or provider cap full); such an offer is rejected with that reason even when compatible.
    Ties break on offer id; unpriced offers come after every priced one (see the module docstring).
    """
    catalog = offers if isinstance(offers, Catalog) else Catalog(offers)
    compatible, incompatible = catalog.ranking(requirement_of(item))
    eligible = tuple(p.offer for p in compatible if p.key not in unavailable)
    blocked = [Rejection(p.key[0], p.key[1], (unavailable[p.key],)) for p in compatible if p.key in unavailable]
    return OfferChoice(
        demand_id=item.demand_id,
        chosen=eligible[0] if eligible else None,
        eligible=eligible,
        rejected=tuple(sorted((*incompatible, *blocked), key=lambda r: (r.provider, r.template_id))),
    )
