"""A small, correct provider plugin (stdlib only) for the conformance kit's tests, with switchable contract breaks.

State lives in $PRO_DATA_DIR/state.json so separate one-shot calls agree. $PRO_CONF_DIR/mini.json may hold
{"break": [...]} with any of:
  bad_json        getAvailableTemplates prints something that is not JSON
  missing_fields  requestMachines answers without requestId
  non_idempotent  the same op_id creates new machines again
  missing_tags    machines get no tags and no instanceRef
  sticky_return   returned machines stay in listMachines
  untyped_errors  an unknown template fails with a plain message instead of an error document
  no_paging       listMachines ignores pageSize and cursor (an older plugin: everything, one page)
  page_loop       listMachines gives the same nextCursor on every page
  page_repeat     listMachines's last page repeats the first machine
  fresh_ids       every answer carries a new id: requestMachines makes new machines under a new requestId for an
                  op_id it has seen (it never looks the op_id up), getRequestStatus answers under a new id
  tagless         machines get no tags and no instanceRef, and listMachines lists every live machine whatever the
                  filter (it kept no tags to filter by)
  bad_describe    describeProvider breaks its schema four times (name, version, contractVersion, features.tags)
  bad_list_status listMachines gives every machine a status that is not a string (the schema refuses the answer)
  aon_fits        describeProvider declares allOrNothing, yet requestMachines makes what fits the template's
                  maxNumber (all or nothing included) instead of refusing the request
  reclaim_foreign describeProvider declares reclaimsByTags, yet getReturnRequests asked by tags wants back a
                  machine that carries none of them (one it never made)
  hang:<action>   that action never answers
Usage: mini.py oneshot <action> -f <file> | mini.py serve
"""

import fcntl
import json
import os
import sys
import time

CONF = {}
conf_path = os.path.join(os.environ.get("PRO_CONF_DIR", ""), "mini.json")
if os.path.exists(conf_path):
    with open(conf_path) as f:
        CONF = json.load(f)
BREAKS = set(CONF.get("break", []))
TEMPLATES = {
    "small": {
        "templateId": "small",
        "maxNumber": 10,
        "attributes": {"type": ["String", "X86_64"], "ncpus": ["Numeric", "2"], "mem": ["Numeric", "4096"]},
        "price": {
            "amount": 0.05,
            "currency": "USD",
            "unit": "hour",
            "source": "mini",
            "timestamp": "2024-01-01T00:00:00Z",
        },
    },
}


class Rejected(Exception):
    def __init__(self, code, message):
        self.code, self.message = code, message


def handle(state, action, doc):
    for b in BREAKS:
        if b == f"hang:{action}":
            time.sleep(3600)
    if action == "describeProvider" and "bad_describe" in BREAKS:
        features = {"idempotentRequest": True, "listMachines": True, "stopMachines": False, "tags": "yes"}
        return {"name": "", "version": 1, "contractVersion": 2, "features": dict(features, priceQuotes=True)}
    if action == "describeProvider":
        features = {
            "idempotentRequest": True,
            "listMachines": True,
            "stopMachines": False,
            "tags": True,
            "priceQuotes": True,
        }
        if "aon_fits" in BREAKS:
            features["allOrNothing"] = True
        if "reclaim_foreign" in BREAKS:
            features["reclaimsByTags"] = True
        return {"name": "mini", "version": "1.0", "contractVersion": 1, "features": features}
    if action == "getAvailableTemplates":
        if "bad_json" in BREAKS:
            return "{templates: oops"
        return {"templates": list(TEMPLATES.values())}
    if action == "requestMachines":
        tid = doc["template"]["templateId"]
        if tid not in TEMPLATES:
            if "untyped_errors" in BREAKS:
                raise Rejected(None, f"no template {tid}")
            raise Rejected("invalid_request", f"unknown templateId {tid!r}")
        op = doc["op_id"]
        if op in state["ops"] and not BREAKS & {"non_idempotent", "fresh_ids"}:
            rid = state["ops"][op]
        else:
            state["seq"] += 1
            rid = f"req-{state['seq']}"
            ids = []
            boots = doc["bootstrap"]
            if "aon_fits" in BREAKS:
                live = sum(1 for m in state["machines"].values() if m["status"] != "terminated")
                boots = boots[: max(0, TEMPLATES[tid]["maxNumber"] - live)]
            for b in boots:
                state["seq"] += 1
                mid = f"m-{state['seq']}"
                tagless = BREAKS & {"missing_tags", "tagless"}
                tags = {} if tagless else dict(doc["tags"], **{"provisionerd:instance": b["instanceRef"]})
                state["machines"][mid] = {
                    "machineId": mid,
                    "name": f"host-{state['seq']}",
                    "status": "running",
                    "launchtime": int(time.time()),
                    "privateIpAddress": "10.1.0.1",
                    "tags": tags,
                    "instanceRef": "" if tagless else b["instanceRef"],
                }
                ids.append(mid)
            state["requests"][rid] = {"kind": "create", "machines": ids}
            state["ops"][op] = rid
        out = {"requestId": rid, "message": ""}
        if "missing_fields" in BREAKS:
            del out["requestId"]
        return out
    if action == "requestReturnMachines":
        op = doc["op_id"]
        if op not in state["ops"]:
            state["seq"] += 1
            rid = f"ret-{state['seq']}"
            ids = [m["machineId"] for m in doc["machines"] if m["machineId"] in state["machines"]]
            for mid in ids:
                if "sticky_return" not in BREAKS:
                    state["machines"][mid]["status"] = "terminated"
            state["requests"][rid] = {"kind": "return", "machines": ids}
            state["ops"][op] = rid
        return {"requestId": state["ops"][op], "message": ""}
    if action == "getRequestStatus":
        out = []
        for r in doc["requests"]:
            req = state["requests"].get(r["requestId"])
            if req is None:
                out.append(
                    {
                        "requestId": r["requestId"],
                        "status": "complete_with_error",
                        "message": "unknown request",
                        "machines": [],
                    }
                )
                continue
            ms = []
            for mid in req["machines"]:
                m = state["machines"][mid]
                stuck = "never_complete" in BREAKS and req["kind"] == "create" and m["status"] != "terminated"
                entry = {
                    "machineId": mid,
                    "name": m["name"],
                    "result": "executing" if stuck else "succeed",
                    "status": m["status"],
                    "privateIpAddress": m["privateIpAddress"],
                    "launchtime": m["launchtime"],
                    "message": "",
                }
                if not BREAKS & {"missing_tags", "tagless"}:
                    entry.update(instanceRef=m["instanceRef"], tags=m["tags"])
                ms.append(entry)
            never = "never_complete" in BREAKS and req["kind"] == "create"
            if "fresh_ids" in BREAKS:
                state["seq"] += 1
            out.append(
                {
                    "requestId": f"req-{state['seq']}" if "fresh_ids" in BREAKS else r["requestId"],
                    "status": "running" if never else "complete",
                    "message": "",
                    "machines": ms,
                }
            )
        return {"requests": out}
    if action == "getReturnRequests":
        foreign = [{"machine": "elsewhere", "machineId": "m-elsewhere", "gracePeriod": 60}]
        wanted = foreign if "reclaim_foreign" in BREAKS and "tags" in doc else []
        return {"status": "complete", "message": "", "requests": wanted}
    if action == "listMachines":
        want = doc["tags"]
        found = [
            dict(
                {k: m[k] for k in ("machineId", "name", "status", "launchtime", "privateIpAddress", "tags")},
                **({"status": 0} if "bad_list_status" in BREAKS else {}),
            )
            for m in state["machines"].values()
            if m["status"] != "terminated"
            and ("tagless" in BREAKS or all(m["tags"].get(k) == v for k, v in want.items()))
        ]
        size, cursor = doc.get("pageSize"), doc.get("cursor")
        if size is None or "no_paging" in BREAKS:
            return {"machines": found}
        found.sort(key=lambda m: m["machineId"])
        first = found[:1]
        if cursor is not None:
            found = [m for m in found if m["machineId"] > cursor]
        if len(found) <= size:
            return {"machines": first + found if "page_repeat" in BREAKS and cursor else found}
        page = found[:size]
        return {"machines": page, "nextCursor": "again" if "page_loop" in BREAKS else page[-1]["machineId"]}
    raise Rejected("invalid_request", f"unsupported action {action}")


def locked_state(fn):
    path = os.path.join(os.environ["PRO_DATA_DIR"], "mini-state.json")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = {"seq": 0, "ops": {}, "requests": {}, "machines": {}}
        if os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
        try:
            return fn(state)
        finally:
            with open(path + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(path + ".tmp", path)


def oneshot(action, path):
    with open(path) as f:
        doc = json.load(f)
    try:
        out = locked_state(lambda s: handle(s, action, doc))
    except Rejected as exc:
        print(exc.message if exc.code is None else json.dumps({"error": {"code": exc.code, "message": exc.message}}))
        return 1
    print(out if isinstance(out, str) else json.dumps(out))
    return 0


def serve():
    for raw in sys.stdin:
        frame = json.loads(raw)
        try:
            out = locked_state(lambda s, frame=frame: handle(s, frame["action"], frame["input"]))
            line = json.dumps({"id": frame["id"], "result": out}) if not isinstance(out, str) else out
        except Rejected as exc:
            if exc.code is None:
                line = json.dumps({"id": frame["id"], "error": {"message": exc.message}})
            else:
                line = json.dumps({"id": frame["id"], "error": {"code": exc.code, "message": exc.message}})
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        sys.exit(oneshot(sys.argv[2], sys.argv[4]))
