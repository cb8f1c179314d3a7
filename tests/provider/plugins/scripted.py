"""A test plugin whose behaviour each call's input chooses (stdlib only).

``listMachines`` is scripted by its filter's cluster tag: ``regular`` (two pages of two machines), ``odd-ref`` (a
page the schema takes with an ``instanceRef`` that is a number), ``no-name`` (a machine without its required name),
``garbage`` (a line that is not JSON).

``getRequestStatus`` is scripted: the first requestId says what to do.
  ok:<id>             answer a valid status for <id> (two machines)
  sleep:<s>:<id>      answer after <s> seconds (persistent: in a thread, so answers come out of order)
  hang-with-child     start a grandchild ``sleep 1000`` (pid written to $PRO_DATA_DIR/grandchild.pid), hang
  crash               exit 3 at once (persistent: with other calls pending)
  garbage             print a line that is not JSON
  big                 print a 3 MB line
  unknown-id          (persistent) answer with another id
  bad-output          valid JSON that fails the output schema
  huge-launch         a valid status whose machines' launchtime has 400 digits (no float holds it)
  reject              an error document with code quota_exceeded
  plain-fail          (one-shot) exit 1 with a plain message
  leak                print $SECRET_KEY and the input to stderr and stdout, then exit 1
Other actions answer minimal valid documents (requestMachines echoes nothing secret).
Usage: scripted.py oneshot <action> -f <file> | scripted.py serve
"""

import json
import os
import subprocess
import sys
import threading
import time

out_lock = threading.Lock()


def status(request_id):
    return {
        "requests": [
            {
                "requestId": request_id,
                "status": "complete",
                "message": "",
                "machines": [
                    {
                        "machineId": f"{request_id}-m{i}",
                        "name": f"host-{i}",
                        "result": "succeed",
                        "status": "running",
                        "privateIpAddress": f"10.0.0.{i}",
                        "launchtime": 1700000000,
                        "message": "",
                    }
                    for i in range(2)
                ],
            }
        ]
    }


def behave(action, doc, reply, persistent):
    """Calls reply(kind, payload) with kind 'result' | 'error' | 'raw'."""
    if action == "getAvailableTemplates":
        return reply("result", {"templates": []})
    if action in ("requestMachines", "requestReturnMachines", "stopMachines"):
        return reply("result", {"requestId": "req-1", "message": ""})
    if action == "listMachines":
        return listing(doc, reply)
    if action != "getRequestStatus":
        return reply("error", {"code": "invalid_request", "message": f"unsupported {action}"})
    rid = doc["requests"][0]["requestId"]
    if rid.startswith("ok:"):
        return reply("result", status(rid[3:]))
    if rid.startswith("sleep:"):
        _, secs, real = rid.split(":", 2)
        time.sleep(float(secs))
        return reply("result", status(real))
    if rid == "hang-with-child":
        child = subprocess.Popen(
            ["sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        path = os.path.join(os.environ["PRO_DATA_DIR"], "grandchild.pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(child.pid))
        os.rename(path + ".tmp", path)
        time.sleep(1000)
    if rid == "crash":
        sys.stderr.write("about to crash\n")
        sys.stderr.flush()
        os._exit(3)
    if rid == "garbage":
        return reply("raw", "this is not json")
    if rid == "big":
        return reply("raw", json.dumps({"pad": "x" * (3 << 20)}))
    if rid == "bad-output":
        return reply("result", {"requests": [{"requestId": "r", "status": "exploded", "machines": []}]})
    if rid == "huge-launch":
        answer = status("huge")
        for machine in answer["requests"][0]["machines"]:
            machine["launchtime"] = 10**400
        return reply("result", answer)
    if rid == "reject":
        return reply("error", {"code": "quota_exceeded", "message": "quota of 5 reached", "retryable": False})
    if rid == "plain-fail":
        return reply("plain", "something went wrong in the cloud")
    if rid == "leak":
        secret = os.environ.get("SECRET_KEY", "")
        sys.stderr.write(f"debug: key={secret} input={json.dumps(doc)}\n")
        sys.stderr.flush()
        return reply("plain", f"auth failed with key {secret}")
    return reply("error", {"code": "invalid_request", "message": f"unknown script {rid!r}"})


def listing(doc, reply):
    script = doc["tags"]["provisionerd:cluster"]
    first = "cursor" not in doc
    machines = [
        {
            "machineId": f"m-{n}",
            "name": f"host-{n}",
            "status": "running",
            "launchtime": 1700000000 + n,
            "privateIpAddress": f"10.0.0.{n}" if n % 2 else None,
            "tags": {"provisionerd:cluster": script, "provisionerd:instance": f"c/{n}"},
            "instanceRef": f"c/{n}",
        }
        for n in ((1, 2) if first else (3, 4))
    ]
    if script == "garbage":
        return reply("raw", "this is not json")
    if script == "odd-ref":
        machines[0]["instanceRef"] = 5
    if script == "no-name":
        del machines[1]["name"]
    return reply("result", {"machines": machines, "nextCursor": "m-2"} if first else {"machines": machines})


def oneshot(action, path):
    with open(path) as f:
        doc = json.load(f)

    def reply(kind, payload):
        if kind == "result":
            print(json.dumps(payload))
            sys.exit(0)
        if kind == "error":
            print(json.dumps({"error": payload}))
            sys.exit(1)
        if kind == "raw":
            print(payload)
            sys.exit(0)
        print(payload)
        sys.exit(1)

    behave(action, doc, reply, False)


def serve():
    def handle(frame):
        ident = frame["id"]

        def reply(kind, payload):
            if kind in ("result", "error"):
                line = json.dumps({"id": ident, kind: payload})
            elif kind == "raw":
                line = payload
            else:
                line = json.dumps({"id": ident, "error": {"code": "provider_error", "message": payload}})
            if frame["input"].get("requests", [{}])[0].get("requestId") == "unknown-id":
                line = json.dumps({"id": ident + 1000, "result": {}})
            with out_lock:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()

        if frame["input"].get("requests", [{}])[0].get("requestId") == "unknown-id":
            return reply("result", {})
        behave(frame["action"], frame["input"], reply, True)

    log = os.environ.get("SCRIPTED_LOG")
    for raw in sys.stdin:
        frame = json.loads(raw)
        if log:
            with open(log, "a") as f:
                f.write(raw)
        rid = frame["input"].get("requests", [{}])[0].get("requestId", "")
        if rid.startswith(("sleep:", "hang")):
            threading.Thread(target=handle, args=(frame,), daemon=True).start()
        else:
            handle(frame)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        oneshot(sys.argv[2], sys.argv[4])
