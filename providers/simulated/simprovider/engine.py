"""The simulated cloud: every contract action as a function of (config, state, input, now).

No I/O here: the transports (``oneshot``, ``persistent``) load and save the state around a call. ``handle`` returns
an ``Outcome`` that says what to answer, how late, whether to lose the answer (hang/crash/garbage faults), and how
much the state changed: ``SOFT`` (poll counters, fault counters: saved without fsync) or ``DURABLE`` (machines
created or returned: saved with fsync before answering, as a cloud commits before it acknowledges).

State layout (``state.json``): ``next`` (id counters), ``ops`` (op_id -> request id), ``requests``, ``machines``,
``faults`` (per-rule call counters), ``licenses`` (pool -> units returned and when the grant was first listed). A
machine's ``state`` is ``pending``, ``running``, ``shutting-down``,
``terminated`` (returned) or ``vanished``. Join tokens are never stored: only their SHA-256.
"""

from __future__ import annotations

import hashlib
import time

from provisionerd.plugin_sdk.documents import describe
from provisionerd.plugin_sdk.errors import PluginError

from . import faults, lifecycle
from .inputs import (
    bootstrap_list,
    items,
    machine_refs,
    non_empty_str,
    obj,
    op_and_tags,
    paging,
    request_refs,
    tag_filter,
)

NONE, SOFT, DURABLE = 0, 1, 2
VERSION = "1.0.0"
PRICE_SOURCE = "simulated (not a real price)"


class Outcome:
    __slots__ = ("result", "error", "delay", "disrupt", "change")

    def __init__(self) -> None:
        self.result: dict | None = None
        self.error: dict | None = None
        self.delay = 0.0
        self.disrupt: str | None = None
        self.change = NONE


def new_state() -> dict:
    return {"version": 1, "next": {"machine": 0, "request": 0}, "ops": {}, "requests": {}, "machines": {}, "faults": {}}


def _ident(seed: str, kind: str, n: int, width: int) -> str:
    return hashlib.sha256(f"{seed}/{kind}/{n}".encode()).hexdigest()[:width]


def _rfc3339(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


class Call:
    """One action being handled: the inputs plus what it changed."""

    __slots__ = ("config", "state", "now", "plan", "change")

    def __init__(self, config: dict, state: dict, now: float, plan: faults.Plan) -> None:
        self.config, self.state, self.now, self.plan = config, state, now, plan
        self.change = SOFT if plan.fired else NONE

    def touched(self, level: int) -> None:
        self.change = max(self.change, level)

    def next_id(self, kind: str) -> int:
        counters = self.state["next"]
        counters[kind] += 1
        return counters[kind]


def _replay(state: dict, op_id: str, fingerprint: list, what: str) -> dict | None:
    """The answer to an op_id seen before (``what`` says what it did), or None for a new one; an op_id reused for a
    different ask is ``invalid_request``."""
    known = state["ops"].get(op_id)
    if known is None:
        return None
    if state["requests"][known]["fingerprint"] != fingerprint:
        raise PluginError("invalid_request", f"op_id {op_id!r} was already used for a different request")
    return {"requestId": known, "message": f"op_id {op_id!r} {what}"}


def describe_provider(call: Call, inp: dict) -> dict:
    config = call.config
    priced = any(t["price"] is not None for t in config["templates"])
    pools = bool(config["licensePools"])
    return describe(
        config["name"], VERSION, price_quotes=priced, licensePools=pools, allOrNothing=True, reclaimsByTags=True
    )


def get_available_templates(call: Call, inp: dict) -> dict:
    stamp = _rfc3339(call.now)
    out = []
    for t in call.config["templates"]:
        doc = {"templateId": t["templateId"], "maxNumber": t["maxNumber"], "attributes": t["attributes"]}
        if t["price"] is not None:
            p = t["price"]
            doc["price"] = {
                "amount": p["amount"],
                "currency": p["currency"],
                "unit": p["unit"],
                "source": PRICE_SOURCE,
                "timestamp": p.get("timestamp", stamp),
            }
        out.append(doc)
    return {"templates": out}


def request_machines(call: Call, inp: dict) -> dict:
    template = obj(inp.get("template"), "template")
    tid = non_empty_str(template.get("templateId"), "template.templateId")
    count = template.get("machineCount")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise PluginError("invalid_request", f"template.machineCount: expected an integer >= 1, got {count!r}")
    op_id, tags = op_and_tags(inp)
    boots = bootstrap_list(inp.get("bootstrap"), count)  # before the op_id lookup: a replay is checked too
    whole = inp.get("allOrNothing", False)
    if not isinstance(whole, bool):
        raise PluginError("invalid_request", f"allOrNothing: expected a boolean, got {whole!r}")
    state = call.state
    fingerprint = ["create", tid, count] + (["whole"] if whole else [])
    replay = _replay(state, op_id, fingerprint, "already requested: same request, no new machines")
    if replay is not None:
        return replay
    t = call.config["templatesById"].get(tid)
    if t is None:
        raise PluginError("invalid_request", f"unknown template {tid!r}")
    live = [m for m in state["machines"].values() if m["state"] in lifecycle.LIVE]
    live_t = sum(1 for m in live if m["templateId"] == tid)
    if len(live) + count > call.config["maxMachines"]:
        raise PluginError("quota_exceeded", f"account quota: {len(live)} live + {count} > {call.config['maxMachines']}")
    if live_t + count > t["maxNumber"]:
        raise PluginError("quota_exceeded", f"template {tid!r}: {live_t} live + {count} > maxNumber {t['maxNumber']}")
    available = t["capacity"] - live_t
    if available <= 0:
        raise PluginError("capacity_unavailable", f"template {tid!r}: no capacity left")
    if whole and available < count:  # all or nothing: what fits is not created
        raise PluginError("capacity_unavailable", f"template {tid!r}: room for {available} of {count} (all or nothing)")
    made = min(count, available)
    why = "capacity"
    rule = call.plan.partial
    if rule is not None:
        limit = int(rule["fraction"] * count) if "fraction" in rule else rule["count"]
        if limit < made:
            made, why = limit, "partial fulfilment fault"
    seed = call.config["seed"]
    rid = "req-" + _ident(seed, "request", call.next_id("request"), 12)
    ids = []
    for i in range(made):
        n = call.next_id("machine")
        mid = "i-" + _ident(seed, "machine", n, 17)
        ip = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
        boot = boots[i]
        machine = {
            "machineId": mid,
            "name": "ip-" + ip.replace(".", "-"),
            "privateIpAddress": ip,
            "seq": n,
            "templateId": tid,
            "requestId": rid,
            "launchtime": int(call.now),
            "state": "pending",
            "tags": {**tags, "provisionerd:instance": boot["instanceRef"]},
            "instanceRef": boot["instanceRef"],
            # Models "the machine received its bootstrap" without keeping the secret itself.
            "joinTokenSha256": hashlib.sha256(boot["joinToken"].encode()).hexdigest(),
        }
        state["machines"][mid] = machine
        ids.append(mid)
    message = "" if made == count else f"created {made} of {count} machines ({why})"
    state["requests"][rid] = {
        "kind": "create",
        "opId": op_id,
        "fingerprint": fingerprint,
        "asked": count,
        "machineIds": ids,
        "polls": 0,
        "createdAt": int(call.now),
        "message": message,
    }
    state["ops"][op_id] = rid
    lifecycle.advance_boot(call.config, state, ids, 0, call.now)
    call.touched(DURABLE)
    return {"requestId": rid, "message": f"requested {count} x {tid}"}


def get_request_status(call: Call, inp: dict) -> dict:
    out = []
    for rid in request_refs(inp):
        req = call.state["requests"].get(rid)
        if req is None:
            out.append(
                {"requestId": rid, "status": "complete_with_error", "message": "unknown request", "machines": []}
            )
            continue
        if lifecycle.poll(call.config, call.state, req, call.now):
            call.touched(SOFT)
        out.append(lifecycle.request_view(call.state, rid, req))
    return {"requests": out}


def request_return_machines(call: Call, inp: dict) -> dict:
    refs = machine_refs(inp, required=True)
    op_id, tags = op_and_tags(inp)
    state = call.state
    fingerprint = ["return", sorted(r["machineId"] for r in refs)]
    replay = _replay(state, op_id, fingerprint, "already requested: same return request")
    if replay is not None:
        return replay
    rid = "ret-" + _ident(call.config["seed"], "request", call.next_id("request"), 12)
    entries = [lifecycle.start_return(call.config, state, ref, tags, rid) for ref in refs]
    state["requests"][rid] = {
        "kind": "return",
        "opId": op_id,
        "fingerprint": fingerprint,
        "entries": entries,
        "polls": 0,
        "createdAt": int(call.now),
        "message": "",
    }
    state["ops"][op_id] = rid
    call.touched(DURABLE)
    return {"requestId": rid, "message": f"returning {len(refs)} machine(s)"}


def get_return_requests(call: Call, inp: dict) -> dict:
    asked = {r["machineId"] for r in machine_refs(inp, required=False)}
    tags = tag_filter(inp["tags"]) if inp.get("tags") is not None else None
    cursor, size = paging(inp)
    wanted = lifecycle.return_requests(call.state, asked, call.now, tags)
    requests, next_cursor = lifecycle.page(wanted, cursor, size)
    out = {"status": "complete", "message": "", "requests": requests}
    if next_cursor is not None:
        out["nextCursor"] = next_cursor
    return out


def list_machines(call: Call, inp: dict) -> dict:
    wanted = tag_filter(inp.get("tags"))
    cursor, size = paging(inp)
    machines, next_cursor = lifecycle.listing(call.state, wanted, cursor, size)
    return {"machines": machines} if next_cursor is None else {"machines": machines, "nextCursor": next_cursor}


def _pool_state(call: Call, pool: dict) -> dict:
    held = call.state.setdefault("licenses", {})
    entry = held.get(pool["pool"])
    if entry is None:
        since = pool["checkedOut"] if pool["checkedOut"] is not None else int(call.now)
        entry = held[pool["pool"]] = {"returned": 0, "checkedOut": since}
        call.touched(DURABLE)
    return entry


def list_licenses(call: Call, inp: dict) -> dict:
    """Every configured pool's grant to the cluster: ``granted`` is what the config checked out minus what
    ``returnLicenses`` gave back (never below the units in use)."""
    if not call.config["licensePools"]:
        raise PluginError("invalid_request", "'listLicenses': not supported (features.licensePools is false)")
    tag_filter(inp.get("tags"))
    cursor, size = paging(inp)
    grants = []
    for pool in call.config["licensePools"]:
        entry = _pool_state(call, pool)
        granted = max(pool["granted"] - entry["returned"], pool["inUse"])
        grants.append(
            {"pool": pool["pool"], "granted": granted, "inUse": pool["inUse"], "checkedOut": entry["checkedOut"]}
        )
    page, next_cursor = lifecycle.page(grants, cursor, size, "pool")
    return {"licenses": page} if next_cursor is None else {"licenses": page, "nextCursor": next_cursor}


def return_licenses(call: Call, inp: dict) -> dict:
    """Check units back in. Idempotent by op_id; units in use by the source's own count are never taken back
    (a return that names more gets only the idle ones, and says so)."""
    pools = {p["pool"]: p for p in call.config["licensePools"]}
    if not pools:
        raise PluginError("invalid_request", "'returnLicenses': not supported (features.licensePools is false)")
    op_id, _tags = op_and_tags(inp)
    asked = items(inp.get("licenses"), "licenses", required=True)
    wanted = []
    for i, entry in enumerate(asked):
        obj(entry, f"licenses[{i}]")
        name = non_empty_str(entry.get("pool"), f"licenses[{i}].pool")
        count = entry.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise PluginError("invalid_request", f"licenses[{i}].count: expected an integer >= 1, got {count!r}")
        if name not in pools:
            raise PluginError("invalid_request", f"licenses[{i}].pool: unknown pool {name!r}")
        wanted.append((name, count))
    state = call.state
    fingerprint = ["licenses", sorted(wanted)]
    replay = _replay(state, op_id, fingerprint, "already returned: nothing more checked in")
    if replay is not None:
        return replay
    rid = "lic-" + _ident(call.config["seed"], "request", call.next_id("request"), 12)
    done = []
    for name, count in wanted:
        pool, entry = pools[name], _pool_state(call, pools[name])
        idle = max(pool["granted"] - entry["returned"] - pool["inUse"], 0)
        entry["returned"] += min(count, idle)
        done.append(f"{name}: {min(count, idle)} of {count}")
    state["requests"][rid] = {
        "kind": "licenses",
        "opId": op_id,
        "fingerprint": fingerprint,
        "entries": [],
        "polls": 0,
        "createdAt": int(call.now),
        "message": "; ".join(done),
    }
    state["ops"][op_id] = rid
    call.touched(DURABLE)
    return {"requestId": rid, "message": "checked in " + "; ".join(done)}


ACTIONS = {
    "describeProvider": describe_provider,
    "getAvailableTemplates": get_available_templates,
    "requestMachines": request_machines,
    "getRequestStatus": get_request_status,
    "requestReturnMachines": request_return_machines,
    "getReturnRequests": get_return_requests,
    "listMachines": list_machines,
    "listLicenses": list_licenses,
    "returnLicenses": return_licenses,
}


#: The requestId a ``foreign_id`` fault answers: no request of this plugin ever has it.
FOREIGN_ID = "req-ffffffffffff"


def handle(config: dict, state: dict, action: str, inp: object, now: float) -> Outcome:
    """Answer one call: faults first (they may refuse it), then world events (vanish, reclaim), then the action."""
    outcome = Outcome()
    handler = ACTIONS.get(action)
    if handler is None:
        detail = "not supported (features.stopMachines is false)" if action == "stopMachines" else "unknown action"
        outcome.error = PluginError("invalid_request", f"{action!r}: {detail}").document()
        return outcome
    template = inp.get("template") if isinstance(inp, dict) else None
    tid = template.get("templateId") if isinstance(template, dict) else None
    plan = faults.plan(config, state, action, tid)
    call = Call(config, state, now, plan)
    outcome.delay, outcome.disrupt = plan.delay, plan.disrupt
    try:
        if plan.error is not None:
            raise plan.error
        if plan.vanish or plan.reclaim:
            if lifecycle.world_events(state, plan, now):
                call.touched(DURABLE)
        if not isinstance(inp, dict):
            raise PluginError("invalid_request", f"input: expected a JSON object, got {type(inp).__name__}")
        outcome.result = handler(call, inp)
        if plan.foreign and isinstance(outcome.result, dict) and "requestId" in outcome.result:
            outcome.result = {**outcome.result, "requestId": FOREIGN_ID}  # took effect; answered an id never made
    except PluginError as fault:
        outcome.result, outcome.error = None, fault.document()
    outcome.change = call.change
    return outcome
