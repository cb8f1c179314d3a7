"""Machine lifecycle in the simulated cloud: boot, return, vanish, reclaim, and the views the actions print.

A machine is ``pending`` until its create request has been polled ``bootPolls`` times and ``bootSeconds`` have
passed; then ``running``. A return makes it ``shutting-down`` until the return request has been polled
``returnPolls`` times, then ``terminated``. A vanish fault makes it ``vanished`` (gone without being asked).
"""

from __future__ import annotations

import bisect
import heapq

LIVE = ("pending", "running", "shutting-down")


def advance_boot(config: dict, state: dict, ids: list[str], polls: int, now: float) -> bool:
    """Start the pending machines whose boot delay has passed. Returns whether any changed."""
    if polls < config["bootPolls"]:
        return False
    changed = False
    machines = state["machines"]
    for mid in ids:
        m = machines[mid]
        if m["state"] == "pending" and now - m["launchtime"] >= config["bootSeconds"]:
            m["state"] = "running"
            changed = True
    return changed


def _finish_returns(config: dict, state: dict, req: dict) -> bool:
    if req["polls"] < config["returnPolls"]:
        return False
    changed = False
    for entry in req["entries"]:
        m = state["machines"].get(entry["machineId"])
        if m is not None and m["state"] == "shutting-down" and not entry["refused"]:
            m["state"] = "terminated"
            changed = True
    return changed


def poll(config: dict, state: dict, req: dict, now: float) -> bool:
    """Count a status poll of ``req`` and move its machines along. Returns whether the state changed.

    Requests whose machines have all settled are not counted, so polling a finished request writes nothing.
    """
    machines = state["machines"]
    if req["kind"] == "create":
        if not any(machines[mid]["state"] == "pending" for mid in req["machineIds"]):
            return False
        req["polls"] += 1
        advance_boot(config, state, req["machineIds"], req["polls"], now)
        return True
    if not any(machines.get(e["machineId"], {}).get("state") == "shutting-down" for e in req["entries"]):
        return False
    req["polls"] += 1
    _finish_returns(config, state, req)
    return True


def _create_entry(m: dict) -> tuple[str, str, str]:
    s = m["state"]
    if s == "pending":
        return "executing", "pending", ""
    if s == "vanished":
        return "fail", "terminated", "machine vanished (terminated outside provisionerd)"
    if s == "terminated":
        return "succeed", "terminated", "returned"
    return "succeed", s, ""


def _machine_doc(m: dict, result: str, status: str, message: str) -> dict:
    return {
        "machineId": m["machineId"],
        "name": m["name"],
        "result": result,
        "status": status,
        "privateIpAddress": m["privateIpAddress"],
        "launchtime": m["launchtime"],
        "message": message,
        "instanceRef": m["instanceRef"],
        "tags": m["tags"],
    }


def request_view(state: dict, rid: str, req: dict) -> dict:
    """One entry of ``getRequestStatus``'s ``requests`` list."""
    machines = state["machines"]
    docs = []
    if req["kind"] == "create":
        for mid in req["machineIds"]:
            docs.append(_machine_doc(machines[mid], *_create_entry(machines[mid])))
    else:
        for e in req["entries"]:
            m = machines.get(e["machineId"])
            if m is None:
                docs.append(
                    {
                        "machineId": e["machineId"],
                        "name": e["name"],
                        "result": "succeed",
                        "status": "terminated",
                        "message": "no such machine: nothing to return",
                    }
                )
            elif e["refused"]:
                docs.append(_machine_doc(m, "fail", m["state"], e["refused"]))
            elif m["state"] == "shutting-down":
                docs.append(_machine_doc(m, "executing", "shutting-down", ""))
            else:
                docs.append(_machine_doc(m, "succeed", "terminated", ""))
    results = {d["result"] for d in docs}
    if "executing" in results:
        status = "running"
    elif "fail" in results or (req["kind"] == "create" and len(docs) < req["asked"]):
        status = "complete_with_error"
    else:
        status = "complete"
    return {"requestId": rid, "status": status, "message": req["message"], "machines": docs}


def start_return(config: dict, state: dict, ref: dict, tags: dict, rid: str) -> dict:
    """Begin returning one machine; returns the return request's entry for it.

    A machine owned by another cluster (its ``provisionerd:cluster`` tag differs from the caller's) is refused:
    a plugin never touches what it cannot prove is the caller's. Unknown and already returned machines are
    harmless no-ops reported as terminated.
    """
    entry = {"machineId": ref["machineId"], "name": ref["name"], "requestId": rid, "refused": ""}
    m = state["machines"].get(ref["machineId"])
    if m is None:
        return entry
    entry["name"] = m["name"]
    for key in ("provisionerd:cluster", "provisionerd:provider"):
        if key in tags and m["tags"].get(key) != tags[key]:
            entry["refused"] = f"not returned: its {key} tag does not match the caller's"
            return entry
    if m["state"] in ("pending", "running"):
        m["state"] = "shutting-down"
        m["returnedBy"] = rid
        if config["returnPolls"] == 0:
            m["state"] = "terminated"
    return entry


def page(
    entries: list[dict], cursor: str | None, size: int | None, key: str = "machineId"
) -> tuple[list[dict], str | None]:
    """One page of a paged answer (``listMachines``, ``getReturnRequests``): keyset paging in ``key`` order, the
    entries after ``cursor``, at most ``size``; the next cursor is the page's last key when more follow. No
    ``size`` (a daemon that does not page): everything, no cursor."""
    after = entries if cursor is None else [e for e in entries if e[key] > cursor]
    if size is None or len(after) <= size:
        return sorted(after, key=lambda e: e[key]), None
    first = heapq.nsmallest(size, after, key=lambda e: e[key])
    return first, first[-1][key]


def return_requests(state: dict, asked: set[str], now: float, tags: dict | None = None) -> list[dict]:
    """``getReturnRequests``: reclaimed live machines (with ``tags``, features.reclaimsByTags: those asked about or
    carrying every tag), plus any asked-about machine that vanished (grace 0)."""
    out = []
    for m in state["machines"].values():
        if (
            m["state"] in LIVE
            and "reclaimedAt" in m
            and (tags is None or m["machineId"] in asked or all(m["tags"].get(k) == v for k, v in tags.items()))
        ):
            left = max(0, m["gracePeriod"] - int(now - m["reclaimedAt"]))
            out.append({"machine": m["name"], "machineId": m["machineId"], "gracePeriod": left})
        elif m["state"] == "vanished" and m["machineId"] in asked:
            out.append({"machine": m["name"], "machineId": m["machineId"], "gracePeriod": 0})
    return out


#: The machine ids in order, for keyset pages: (id of the machines dict, its size) -> sorted ids. Machines are
#: never removed from the state, so the same dict with the same size holds the same ids.
_ORDER: dict = {"key": None, "ids": []}


def _ordered_ids(machines: dict) -> list[str]:
    key = (id(machines), len(machines))
    if _ORDER["key"] != key:
        _ORDER["key"], _ORDER["ids"] = key, sorted(machines)
    return _ORDER["ids"]


def listing(
    state: dict, wanted: dict, cursor: str | None = None, size: int | None = None
) -> tuple[list[dict], str | None]:
    """``listMachines``: live machines carrying every wanted tag, one keyset page (see ``page``). A page walks
    the ids in order from the cursor and stops when it is full, so a page of 500 out of 100,000 costs 500."""
    wanted_items = wanted.items()
    machines = state["machines"]
    ids = _ordered_ids(machines)
    picked: list[dict] = []
    for i in range(0 if cursor is None else bisect.bisect_right(ids, cursor), len(ids)):
        m = machines[ids[i]]
        if m["state"] in LIVE and all(m["tags"].get(k) == v for k, v in wanted_items):
            picked.append(m)
            if size is not None and len(picked) > size:
                break
    next_cursor = None
    if size is not None and len(picked) > size:
        picked = picked[:size]
        next_cursor = picked[-1]["machineId"]
    docs = [
        {
            "machineId": m["machineId"],
            "name": m["name"],
            "status": m["state"],
            "launchtime": m["launchtime"],
            "privateIpAddress": m["privateIpAddress"],
            "tags": m["tags"],
        }
        for m in picked
    ]
    return docs, next_cursor


def world_events(state: dict, plan, now: float) -> bool:
    """Apply fired vanish/reclaim faults to the oldest eligible live machines. Returns whether any machine changed."""
    changed = False
    by_age = sorted((m for m in state["machines"].values() if m["state"] in LIVE), key=lambda m: m["seq"])
    for rule in plan.vanish:
        victims = [
            m
            for m in by_age
            if m["state"] in LIVE and (rule["templates"] is None or m["templateId"] in rule["templates"])
        ][: rule["count"]]
        for m in victims:
            m["state"] = "vanished"
            changed = True
    for rule in plan.reclaim:
        victims = [
            m
            for m in by_age
            if m["state"] in ("pending", "running")
            and "reclaimedAt" not in m
            and (rule["templates"] is None or m["templateId"] in rule["templates"])
        ][: rule["count"]]
        for m in victims:
            m["reclaimedAt"] = int(now)
            m["gracePeriod"] = rule["gracePeriod"]
            changed = True
    return changed
