"""Failure injection: which configured faults fire on this call, decided deterministically.

Each rule counts the calls it matches (kept in the state, so separate one-shot processes count together) and fires
on matching call number ``after + every``, ``after + 2*every``, ... at most ``times`` times. A rule with a
``probability`` fires on those calls only when a hash of (seed, rule index, call number) falls below it: the same
seed and the same sequence of calls give the same faults, without an RNG state to persist.

Kinds and what they do (the engine applies them):
- ``capacity``, ``quota``, ``throttle``, ``auth``, ``provider_error``: the call is refused with the typed error
  (``capacity_unavailable``, ``quota_exceeded``, ``throttled``, ``auth_failed``, ``provider_error``); no effect.
- ``slow``: the answer comes ``delaySeconds`` late.
- ``hang``, ``crash``, ``garbage``: the call takes effect, then the answer is lost: never sent, the process exits
  mid-answer, or a non-JSON line is sent instead. (That is the case the daemon's op_id retry exists for.)
- ``partial``: ``requestMachines`` creates fewer machines than asked (``count``, or ``fraction`` of the ask), even
  an all-or-nothing one (a plugin that breaks its promise: the daemon returns what it made).
- ``foreign_id``: the call takes effect, then answers a requestId the plugin never made (``getRequestStatus`` says
  ``unknown request`` for it): a protocol violation the daemon must not take for "nothing made".
- ``vanish``: ``count`` live machines disappear (oldest first): gone from listings, ``fail``/``terminated``.
- ``reclaim``: ``count`` live machines are reclaimed: ``getReturnRequests`` lists them with ``gracePeriod``.
"""

from __future__ import annotations

import hashlib

from provisionerd.plugin_sdk.errors import PluginError

ERROR_KINDS = {
    "capacity": "capacity_unavailable",
    "quota": "quota_exceeded",
    "throttle": "throttled",
    "auth": "auth_failed",
    "provider_error": "provider_error",
}
DISRUPT_KINDS = ("hang", "crash", "garbage")


class Plan:
    """What the firing rules ask of this call. ``fired`` is true when any counter moved (state must be saved)."""

    __slots__ = ("error", "delay", "disrupt", "partial", "vanish", "reclaim", "foreign", "fired")

    def __init__(self) -> None:
        self.error: PluginError | None = None
        self.delay = 0.0
        self.disrupt: str | None = None
        self.partial: dict | None = None
        self.vanish: list[dict] = []
        self.reclaim: list[dict] = []
        self.foreign = False
        self.fired = False


NO_FAULTS = Plan()


def _unit(seed: str, index: int, n: int) -> float:
    digest = hashlib.sha256(f"{seed}/fault/{index}/{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _fires(rule: dict, counter: dict, seed: str, index: int) -> bool:
    counter["seen"] = n = counter.get("seen", 0) + 1
    if n <= rule["after"] or (n - rule["after"]) % rule["every"]:
        return False
    if rule["times"] is not None and counter.get("fired", 0) >= rule["times"]:
        return False
    if rule["probability"] is not None and _unit(seed, index, n) >= rule["probability"]:
        return False
    counter["fired"] = counter.get("fired", 0) + 1
    return True


def plan(config: dict, state: dict, action: str, template_id: str | None) -> Plan:
    """Count this call against every matching rule and return what the firing ones ask for.

    Mutates ``state["faults"]`` (the per-rule counters). Returns the shared empty plan when no rule matches, so a
    configuration without faults costs one loop over an empty list.
    """
    rules = config["faults"]
    if not rules:
        return NO_FAULTS
    counters = state.setdefault("faults", {})
    result = Plan()
    for index, rule in enumerate(rules):
        if "*" not in rule["actions"] and action not in rule["actions"]:
            continue
        kind = rule["kind"]
        if rule["templates"] is not None and kind not in ("vanish", "reclaim") and template_id not in rule["templates"]:
            continue
        result.fired = True  # a counter moves even when the rule does not fire
        if not _fires(rule, counters.setdefault(f"{index}:{kind}", {}), config["seed"], index):
            continue
        if kind in ERROR_KINDS:
            if result.error is None:
                message = rule["message"] or f"simulated {ERROR_KINDS[kind]} (fault rule {index})"
                result.error = PluginError(ERROR_KINDS[kind], message)
        elif kind == "slow":
            result.delay += rule["delaySeconds"]
        elif kind in DISRUPT_KINDS:
            result.disrupt = result.disrupt or kind
        elif kind == "partial":
            result.partial = result.partial or rule
        elif kind == "foreign_id":
            result.foreign = True
        elif kind == "vanish":
            result.vanish.append(rule)
        elif kind == "reclaim":
            result.reclaim.append(rule)
    return result
