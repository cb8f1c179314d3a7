"""Machine health (issue 20, items 1 and 2): a machine's reported capabilities against its template, and when to
stop replacing unhealthy machines.

Pure; part of :func:`provisionerd.planner.plan.plan`.

**Capabilities.** A worker reports what its machine has when it joins (``HostState.capabilities``, offer attribute
names: ``ncpus``, ``mem`` in MiB, ``type`` and its template's probes, e.g. ``ngpus``; :mod:`provisionerd.agent.
capabilities`). :func:`capability_shortfall` reads the machine's template as the demand side and the report as the
offer side of the one compatibility function offers are chosen by (:func:`provisionerd.planner.offers.reasons_for`),
so "the template says 1 GPU, the machine has 0" reads exactly like an offer rejected for a demand item:
``ngpus 0 < 1 required``. Only what was reported is compared (a machine whose agent has no GPU probe is not
judged on GPUs), and memory is allowed ``MEM_SLACK`` below the template's (the kernel's MemTotal is a few percent
under a cloud's nominal size). A machine that falls short is not supply: it is returned with the reason in its
``ReturnIntent`` (``capability_mismatch: ngpus 0 < 1 required``), its offer is **suspect** for the provider's
``capacity_backoff`` (no new request goes to it: the capacity back-off's memory, ``CapacityState.suspect``), and
its item's deficit is requested again from the next offer.

**Unhealthy machines and ``max_unhealthy``.** A machine is *unhealthy* when the plan finds it lost (reclaimed),
never joined (``never_joined``), not made in time (``provisioning_timeout``) or short of its template
(``capability_mismatch``): every such finding is replaced, as demand still asks for it. But a provider that keeps
making broken machines (a bad image, a driver missing on a whole instance type) would be asked for replacement
after replacement. So, as Cluster API's MachineHealthCheck (``maxUnhealthy``) and ParallelCluster's protected mode
do, each finding is logged (``UnhealthyLog``: ``(at, provider, machine_id)``, one entry per machine), and when a
provider has more than ``max_unhealthy`` findings (a count, and/or a percent of its live machines, rounded up; the
smaller binds) within ``max_unhealthy_window`` seconds, it is **protected**: no new machine is requested from it,
the plan notes ``provider_protected`` with why (an event), and ``provisionerd status`` shows it (``health.machines``).
The unhealthy machines themselves are still returned (they cost money and serve nothing). Protection ends on its
own when the window no longer holds too many findings (no new request means no new finding), so a provider that was
fixed gets another chance and one that was not trips again after ``max_unhealthy`` more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from provisionerd.domain.model import HostState, Offer, ResourceShape
from provisionerd.planner.offers import Catalog, ParsedOffer, parse_offer, reasons_for, requirement_of
from provisionerd.planner.policy import ProviderPolicy

if TYPE_CHECKING:
    from provisionerd.planner.fact_view import MachineRecord

#: The retire reason of a machine short of its template (its ``ReturnIntent.reason`` adds why, after ``": "``).
CAPABILITY_MISMATCH = "capability_mismatch"
#: The same found by a re-probe after the join (``HostState.probed_at``): the machine degraded while it served (a
#: GPU off the bus). Busy, it is drained out of placement and replaced first; returned when idle.
UNHEALTHY_AFTER_JOIN = "unhealthy_after_join"
#: Retire reasons that count as unhealthy findings (and a ``MarkLost``). All are involuntary (``planner.budget``).
UNHEALTHY_REASONS = frozenset({"never_joined", "provisioning_timeout", CAPABILITY_MISMATCH, UNHEALTHY_AFTER_JOIN})
#: The attributes that describe the machine itself: its report must confirm each its template declares.
MACHINE_ATTRIBUTES = frozenset({"ncpus", "mem", "ngpus", "gputype", "type"})
#: Spellings of one architecture: the agent reports the kernel's (``X86_64``, ``AARCH64``), a template may use
#: another tool's (Kubernetes' ``amd64`` / ``arm64``).
ARCH_ALIASES = ({"x86_64", "amd64", "x64"}, {"aarch64", "arm64"})
#: How a ``Boolean`` attribute says true.
TRUE_TEXTS = frozenset({"1", "true", "yes", "y", "on"})
#: Memory may be this fraction below the template's and still pass.
MEM_SLACK = 0.10
#: The longest ``ReturnIntent.reason`` a capability return writes.
MAX_REASON = 300

#: The most findings kept per provider (bounded memory and work when a whole fleet is lost at once: beyond it the
#: count reads "at least", which is far above any sensible ``max_unhealthy``).
MAX_LOGGED = 10_000
#: ``(found at, provider, machine_id)``: unhealthy findings within the window, oldest first.
UnhealthyLog = tuple[tuple[float, str, str], ...]


def required_reports(template: ParsedOffer | Offer) -> tuple[tuple[str, str], ...]:
    """What a machine of ``template`` must report before it counts as supply (``(name, declared value)``): the
    attributes that describe the machine itself, when declared (``ncpus``, ``mem``, ``type``, ``gputype``,
    ``ngpus`` above 0) and every **feature**, a ``Boolean`` attribute declared true (LSF's way of naming one:
    ``"infiniband": ["Boolean", "1"]``). Other attributes (a zone, a pricing model) describe the offer, which the
    provider vouches for, and are compared only when reported."""
    parsed = template if isinstance(template, ParsedOffer) else parse_offer(template)
    out = []
    for name, (kind, value) in sorted(parsed.offer.attributes.items()):
        text = str(value)
        if name in MACHINE_ATTRIBUTES:
            if name == "ngpus" and not (parsed.gpus or 0) > 0:
                continue  # nothing to confirm: having none, or more, never falls short of 0
            out.append((name, text))
        elif kind == "Boolean" and text.strip().lower() in TRUE_TEXTS:
            out.append((name, text))
    return tuple(out)


def confirming_report(template: ParsedOffer | Offer) -> dict[str, str]:
    """The report of a machine that has exactly what ``template`` declares (what :func:`required_reports` asks)."""
    return dict(required_reports(template))


def capability_shortfall(template: ParsedOffer | Offer, reported: Mapping[str, str]) -> tuple[str, ...]:
    """Why a machine reporting ``reported`` falls short of ``template`` (empty: it does not).

    The template's declared ``ncpus``, ``mem``, ``ngpus``, ``gputype``, ``type`` and any other attribute the report
    names become the requirement; the report becomes the offer; :func:`reasons_for` judges. Whatever
    :func:`required_reports` names and the report does not mention falls short too (``ngpus not reported ('1'
    declared)``): a machine is not taken on trust. Keys the template does not declare are never compared.
    """
    parsed = template if isinstance(template, ParsedOffer) else parse_offer(template)
    declared = parsed.offer.attributes
    missing = tuple(
        f"{name} not reported ({value!r} declared)" for name, value in required_reports(parsed) if name not in reported
    )

    def wanted(name: str, value: float | None, slack: float = 0.0) -> int:
        if name not in reported or value is None:
            return 0
        return max(0, math.floor(value * (1.0 - slack)))

    shape = ResourceShape(
        ncpus=wanted("ncpus", parsed.ncpus),
        mem_mb=wanted("mem", parsed.mem_mb, MEM_SLACK),
        gpus=wanted("ngpus", parsed.gpus),
        gpu_type=declared["gputype"][1] if "gputype" in reported and "gputype" in declared else None,
        arch=declared["type"][1] if "type" in reported and "type" in declared else None,
        attributes={
            name: str(declared[name][1]) for name in reported if name in declared and name not in MACHINE_ATTRIBUTES
        },
    )
    if "type" in reported and "type" in declared and _same_arch(str(reported["type"]), str(declared["type"][1])):
        reported = {**reported, "type": str(declared["type"][1])}
    kinds = {name: declared[name][0] if name in declared else "String" for name in reported}
    machine = Offer(
        provider=parsed.offer.provider,
        template_id=parsed.offer.template_id,
        max_number=1,
        attributes={name: (kinds[name], value) for name, value in reported.items()},
    )
    return missing + reasons_for(requirement_of(shape), parse_offer(machine))


def _same_arch(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a == b or any(a in names and b in names for names in ARCH_ALIASES)


class CapabilityCheck:
    """:func:`capability_shortfall` of a host against its machine's template in ``catalog``, for one plan pass.

    A host state is judged once per catalog: ``verdicts`` (``Catalog.verdicts``: instance_ref -> (the host state
    judged, its shortfall)) is checked by identity (host states are replaced, never changed), so a pass over 25,000
    idle hosts that all passed reads a dict per host instead of judging them again. Within a pass, judgements are
    shared per (template, report): machines of one template mostly report alike. A template no longer offered is
    not judged (nothing to compare with)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.verdicts = catalog.verdicts
        if len(self.verdicts) > 400_000:  # hosts long gone: bounded memory
            self.verdicts.clear()
        self._shared: dict[tuple[tuple[str, str], tuple[tuple[str, str], ...]], tuple[str, ...]] = {}

    def judge(self, host: HostState, machine: MachineRecord) -> tuple[str, ...]:
        key = (machine.provider, machine.template_id)
        memo = (key, tuple(host.capabilities.items()))
        found = self._shared.get(memo)
        if found is None:
            template = self.catalog.by_key.get(key)
            found = (
                capability_shortfall(template, host.capabilities)
                if template is not None and self.catalog.verified(key)
                else ()
            )
            if len(self._shared) < 4096:
                self._shared[memo] = found
        self.verdicts[host.instance_ref] = (host, found)
        return found


def mismatch_reason(reasons: Iterable[str], kind: str = CAPABILITY_MISMATCH) -> str:
    """The ``ReturnIntent.reason`` of a machine short of its template: ``capability_mismatch: <why>`` (or
    ``unhealthy_after_join: <why>``), bounded."""
    return f"{kind}: {'; '.join(reasons)}"[:MAX_REASON]


def reason_kind(reason: str) -> str:
    """A retire reason without its detail: ``capability_mismatch: ngpus 0 < 1 required`` -> ``capability_mismatch``."""
    return reason.partition(": ")[0]


# --- max_unhealthy -----------------------------------------------------------------------------------------------


def allowance(own: ProviderPolicy, live: int) -> int | None:
    """How many unhealthy findings a provider with ``live`` machines may have within its window before it is
    protected (``None``: no limit). With both a count and a percent, the smaller binds."""
    limits = []
    if own.max_unhealthy is not None:
        limits.append(own.max_unhealthy)
    if own.max_unhealthy_percent is not None:
        limits.append(math.ceil(own.max_unhealthy_percent * max(live, 0) / 100.0))
    return min(limits) if limits else None


def recorded(
    log: UnhealthyLog, findings: Iterable[tuple[str, str]], now: float, windows: Mapping[str, float]
) -> UnhealthyLog:
    """``log`` with ``findings`` (``(provider, machine_id)``) added at ``now`` (a machine already logged is not
    logged twice, nor beyond ``MAX_LOGGED`` per provider) and every entry older than its provider's window
    (``windows``; 0 when not named) dropped."""
    kept = [e for e in log if e[0] + windows.get(e[1], 0.0) > now]
    seen = {e[2] for e in kept}
    per_provider: dict[str, int] = {}
    for e in kept:
        per_provider[e[1]] = per_provider.get(e[1], 0) + 1
    for provider, machine_id in findings:
        if machine_id in seen or windows.get(provider, 0.0) <= 0 or per_provider.get(provider, 0) >= MAX_LOGGED:
            continue
        kept.append((now, provider, machine_id))
        seen.add(machine_id)
        per_provider[provider] = per_provider.get(provider, 0) + 1
    return tuple(kept)


def unhealthy_count(log: UnhealthyLog, provider: str, now: float, window: float) -> int:
    return sum(1 for at, owner, _ in log if owner == provider and at + window > now)


@attrs.frozen
class Protection:
    """Why ``provider`` gets no new machine: ``unhealthy`` findings within ``window`` s, more than ``allowed``."""

    provider: str
    unhealthy: int
    allowed: int
    window: float
    #: When the oldest finding leaves the window (the earliest time the protection may end).
    eases_at: float

    def reason(self) -> str:
        return (
            f"provider {self.provider!r} protected: {self.unhealthy} unhealthy machines within {self.window:g}s,"
            f" more than max_unhealthy {self.allowed}: replacement stopped"
        )


def protection(log: UnhealthyLog, provider: str, live: int, now: float, own: ProviderPolicy) -> Protection | None:
    """Whether ``provider`` is protected now (see the module docstring); ``None``: it is not."""
    allowed = allowance(own, max(live, unhealthy_count(log, provider, now, own.max_unhealthy_window)))
    if allowed is None:
        return None
    window = own.max_unhealthy_window
    times = [at for at, owner, _ in log if owner == provider and at + window > now]
    if len(times) <= allowed:
        return None
    # Protection lasts while more than ``allowed`` findings stay in the window: until the (n - allowed)-th oldest
    # leaves it.
    times.sort()
    return Protection(provider, len(times), allowed, window, times[len(times) - allowed - 1] + window)


def protections(
    log: UnhealthyLog, live: Mapping[str, int], now: float, policy_of: Callable[[str], ProviderPolicy]
) -> dict[str, Protection]:
    """Every protected provider among those ``log`` names (``policy_of``: a provider's own knobs)."""
    out: dict[str, Protection] = {}
    for provider in sorted({e[1] for e in log}):
        found = protection(log, provider, live.get(provider, 0), now, policy_of(provider))
        if found is not None:
            out[provider] = found
    return out


def status(log: UnhealthyLog, provider: str, live: int, now: float, own: ProviderPolicy) -> dict[str, object]:
    """``provisionerd status``'s ``health.machines`` for one provider."""
    window = own.max_unhealthy_window
    found = protection(log, provider, live, now, own)
    return {
        "unhealthy": unhealthy_count(log, provider, now, window),
        "max_unhealthy": allowance(own, live),
        "window_s": window,
        "protected": found is not None,
        "reason": None if found is None else found.reason(),
        "eases_in_s": None if found is None else round(max(found.eases_at - now, 0.0), 3),
    }
