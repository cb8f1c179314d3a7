"""Turning a legacy plugin's ``getRequestStatus`` answer into our contract's entries. Pure (no I/O).

A create op of ours may be several plugin requests (one per machine when the join token travels in userData);
its entry merges theirs, gives each new machine the next instanceRef of its call (remembered in the journal, so
the pairing never changes between polls), and says plainly what the plugin did not: a "complete" with fewer
machines than asked, calls whose outcome is unknown, machines nobody asked for. A return op's entry is checked
against the machines' own create requests, polled in the same plugin call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisionerd.provider.legacy.journal import ACCEPTED, NOT_ISSUED, REFUSED, CreateOp, ReturnOp, SeenMachine
from provisionerd.provider.legacy.rules import ReturnVerdict, fulfilment, return_verdicts

Entry = dict[str, Any]
#: Part of the message of an entry whose plugin request the plugin left out of its answer.
NOT_REPORTED = "the plugin did not report its request"


def unknown_entry(request_id: str, why: str) -> Entry:
    return {"requestId": request_id, "status": "complete_with_error", "message": why, "machines": []}


def create_entry(request_id: str, op: CreateOp, entries: Mapping[str, Entry]) -> tuple[Entry, bool]:
    """Our entry for create op ``op`` from the plugin's ``entries`` (by plugin requestId); and whether the op's
    machine assignments changed (the journal must then be saved)."""
    changed = False
    machines: list[Entry] = []
    seen_ids: set[str] = set()
    running = False
    plugin_complete = True
    notes: list[str] = []
    extras = 0
    for call in op.accepted():
        assert call.request_id is not None
        entry = entries.get(call.request_id)
        if entry is None:
            running = True
            notes.append(f"{NOT_REPORTED} {call.request_id!r}")
            continue
        running |= entry["status"] == "running"
        plugin_complete &= entry["status"] == "complete"
        if entry.get("message"):
            notes.append(f"{call.request_id}: {entry['message']}")
        for m in entry["machines"]:
            mid = m["machineId"]
            if mid in seen_ids:
                continue
            seen_ids.add(mid)
            seen = op.machines.get(mid)
            if seen is None:
                free = op.unassigned_refs(call)
                seen = SeenMachine(ref=free[0] if free else None, request_id=call.request_id, name=m.get("name", ""))
                op.machines[mid] = seen
                changed = True
            elif m.get("name") and seen.name != m["name"]:
                seen.name = m["name"]  # LSF plugins often name a machine only once it has booted
                changed = True
            ours = dict(m)
            if seen.ref is not None:
                ours["instanceRef"] = seen.ref
            else:
                extras += 1
            machines.append(ours)
    unknown = [c for c in op.calls if c.state not in (ACCEPTED, REFUSED, NOT_ISSUED)]
    refused = [c for c in op.calls if c.state in (REFUSED, NOT_ISSUED)]
    if running:
        return _entry(request_id, "running", notes, machines), changed
    claimed = "complete" if plugin_complete else "complete_with_error"
    counted = fulfilment(op.count, {"status": claimed, "machines": machines})
    if unknown:
        refs = sum(len(c.refs) for c in unknown)
        notes.append(
            f"{refs} machine(s) asked in a call whose outcome is unknown ({unknown[0].detail}): never retried; "
            "whatever it created is invisible (the plugin cannot list machines)"
        )
    if refused:
        notes.append(f"{sum(len(c.refs) for c in refused)} machine(s) not requested: {refused[0].detail}")
    if counted.shortfall and not unknown and not refused:  # else the calls above explain it
        said = "reported complete with" if counted.silent_partial else "delivered"
        notes.append(f"partial fulfilment: the plugin {said} {len(counted.succeeded)} of {op.count} machines")
    if extras:
        notes.append(f"{extras} machine(s) beyond the ask (no instanceRef)")
    ok = plugin_complete and not unknown and not refused and not counted.shortfall and not extras
    return _entry(request_id, "complete" if ok else "complete_with_error", notes, machines), changed


def return_entry(request_id: str, rop: ReturnOp, entry: Entry | None, creates: Mapping[str, Entry | None]) -> Entry:
    """Our entry for return op ``rop``: the plugin's ``entry`` for its request, each claimed success checked
    against ``creates`` (machine id -> the plugin's entry of the request that created it; see
    ``legacy.rules.return_verdicts``)."""
    if rop.state != ACCEPTED or rop.request_id is None:
        return unknown_entry(request_id, f"the return call did not go through ({rop.detail}); return again")
    if entry is None:
        return _entry(request_id, "running", [f"{NOT_REPORTED} {rop.request_id!r}"], [])
    notes = [entry["message"]] if entry.get("message") else []
    if entry["status"] == "running":
        return _entry(request_id, "running", notes, [dict(m) for m in entry["machines"]])
    verdicts = return_verdicts(entry["machines"], creates)
    machines = []
    contradicted = []
    for m in entry["machines"]:
        ours = dict(m)
        verdict = verdicts[m["machineId"]]
        if verdict is ReturnVerdict.STILL_RUNNING:
            ours["result"] = "fail"
            ours["message"] = "the return claimed success but the machine's create request still shows it running"
            contradicted.append(m["machineId"])
        elif verdict is ReturnVerdict.UNVERIFIABLE:
            ours["message"] = (m.get("message") or "") + " (unverified: no create request known for it)"
        machines.append(ours)
    if contradicted:
        notes.append(f"return claimed success but still running: {', '.join(contradicted)}")
    missing = {m["machineId"] for m in rop.machines} - {m["machineId"] for m in entry["machines"]}
    if missing:
        notes.append(f"the plugin's answer leaves out {', '.join(sorted(missing))}")
    status = entry["status"] if not contradicted and not missing else "complete_with_error"
    return _entry(request_id, status, notes, machines)


def _entry(request_id: str, status: str, notes: list[str], machines: list[Entry]) -> Entry:
    return {"requestId": request_id, "status": status, "message": "; ".join(notes), "machines": machines}
