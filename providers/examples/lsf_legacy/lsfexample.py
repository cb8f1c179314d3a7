"""An LSF resource connector host provider, written to IBM LSF's published plugin contract only.

Five scripts (getAvailableTemplates, requestMachines, requestReturnMachines, getRequestStatus, getReturnRequests),
each run as ``<script>.sh -f <input.json>``, answering JSON on stdout, exit status 0 on success and non-zero with a
message otherwise. Environment: PROVIDER_NAME, PRO_CONF_DIR (configuration), PRO_DATA_DIR (our state),
PRO_LSF_LOGDIR (our log), PRO_LSF_TOP.

The "cloud" is a state file: a machine is a record that boots (pending -> running) and terminates. Configuration
lives in $PRO_CONF_DIR: lsfexampleprov_templates.json (the templates) and lsfexampleprov_config.json (settings).
Settings marked TEST make this provider misbehave on purpose, the way real cloud plugins sometimes do:

    LOG_INPUTS            keep a copy of every input file in $PRO_DATA_DIR/inputs/
    BOOT_POLLS            status polls a new machine stays pending (default 1)
    PRIVATE_IP            the privateIpAddress every new machine gets (default 10.200.<n // 256>.<n % 256> for the
                          n-th machine), as a cloud's subnet decides it; tests give 127.0.0.1 to play the machines
    SHORT_FILL            TEST: create this many machines fewer than asked, and still report success
    STICKY_RETURN         TEST: report returns as done while the machines keep running
    SLOW_REQUEST_SECONDS  TEST: requestMachines sleeps this long ...
    SLOW_REQUEST_PHASE    ... "before_create", "after_create" (default) or "after_answer"
    RECLAIM_COUNT         TEST: the cloud wants this many running machines back (oldest first)
    RECLAIM_GRACE         seconds of notice for a reclaimed machine (default 120)
    ACCEPT_ANY_TEMPLATE   TEST: an unknown templateId is taken for the first template instead of refused

userData from the request is the machine's user data: kept with the machine (mode 0600), as a cloud would hand it
to the instance at boot.
"""

import fcntl
import json
import os
import secrets
import sys
import time

ACTIONS = ("getAvailableTemplates", "requestMachines", "requestReturnMachines", "getRequestStatus", "getReturnRequests")
HERE = os.path.dirname(os.path.abspath(__file__))
CONF = os.environ.get("PRO_CONF_DIR") or os.path.join(HERE, "conf")
DATA = os.environ.get("PRO_DATA_DIR") or os.path.join(HERE, "data")
LOGDIR = os.environ.get("PRO_LSF_LOGDIR") or DATA
NAME = os.environ.get("PROVIDER_NAME", "lsfexample")


class Refused(Exception):
    """The request cannot be served: the message goes to stdout, the exit status is 1."""


def log(text):
    with open(os.path.join(LOGDIR, "lsfexample-provider.log"), "a") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {NAME} [{os.getpid()}] {text}\n")


def read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def settings():
    return read_json(os.path.join(CONF, "lsfexampleprov_config.json"), {})


def templates():
    return read_json(os.path.join(CONF, "lsfexampleprov_templates.json"), {"templates": []})["templates"]


class State:
    """The state file, locked for the duration of a ``with`` block and saved atomically on a clean exit."""

    def __enter__(self):
        self.lock = open(os.path.join(DATA, "lsfexample.lock"), "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.path = os.path.join(DATA, "lsfexample-state.json")
        self.doc = read_json(self.path, {"next": 1, "machines": {}, "requests": {}})
        return self.doc

    def __exit__(self, kind, value, tb):
        if kind is None:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f)
            os.replace(tmp, self.path)
        self.lock.close()


def keep_input(action, path):
    folder = os.path.join(DATA, "inputs")
    os.makedirs(folder, exist_ok=True)
    with open(path) as src:
        text = src.read()
    name = f"{time.time_ns()}-{os.getpid()}-{action}.json"
    fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


# --- the five scripts ------------------------------------------------------------------------------------------------


def get_available_templates(_request, conf):
    return {"message": "", "templates": templates()}


def request_machines(request, conf):
    template_id = request["template"]["templateId"]
    count = int(request["template"]["machineCount"])
    template = next((t for t in templates() if t["templateId"] == template_id), None)
    if template is None and conf.get("ACCEPT_ANY_TEMPLATE"):
        template = templates()[0]
        template_id = template["templateId"]
    if template is None:
        raise Refused(f"Template {template_id} is not defined in lsfexampleprov_templates.json")
    if count < 1:
        raise Refused("machineCount must be at least 1")
    delay = float(conf.get("SLOW_REQUEST_SECONDS", 0))
    phase = conf.get("SLOW_REQUEST_PHASE", "after_create")
    if delay and phase == "before_create":
        time.sleep(delay)
    make = max(0, count - int(conf.get("SHORT_FILL", 0)))
    with State() as state:
        live = sum(
            1 for m in state["machines"].values() if m["template"] == template_id and m["status"] != "terminated"
        )
        if live + count > template["maxNumber"]:
            raise Refused(f"Template {template_id}: {live} running + {count} requested > maxNumber")
        request_id = "req-" + secrets.token_hex(4)
        ids = []
        for _ in range(make):
            n = state["next"]
            state["next"] = n + 1
            machine_id = f"lsfex-{n:06d}"
            state["machines"][machine_id] = {
                "name": f"host-{n:06d}.example.internal",
                "ip": str(conf.get("PRIVATE_IP") or f"10.200.{n // 256 % 256}.{n % 256}"),
                "template": template_id,
                "status": "pending",
                "launchtime": int(time.time()),
                "rc_account": request.get("rc_account", "default"),
                "reclaimed_at": None,
            }
            write_user_data(machine_id, request.get("userData") or {})
            ids.append(machine_id)
        state["requests"][request_id] = {"kind": "create", "machines": ids, "polls": 0}
    log(f"requestMachines {request_id}: {count} x {template_id}")
    answer = {"requestId": request_id, "message": f"Request VM from lsfexample successful: {count} machines"}
    if delay and phase == "after_create":
        time.sleep(delay)  # the machines exist; the answer comes late (or never, if we are killed)
    if delay and phase == "after_answer":
        print(json.dumps(answer), flush=True)
        time.sleep(delay)
        return None
    return answer


def write_user_data(machine_id, user_data):
    folder = os.path.join(DATA, "userdata")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(folder, machine_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(user_data, f)


def request_return_machines(request, conf):
    sticky = bool(conf.get("STICKY_RETURN", False))
    with State() as state:
        request_id = "ret-" + secrets.token_hex(4)
        ids = []
        for ref in request["machines"]:
            machine = state["machines"].get(ref["machineId"])
            if machine is None:
                continue
            if not sticky:
                machine["status"] = "terminated"
            ids.append(ref["machineId"])
        state["requests"][request_id] = {"kind": "return", "machines": ids, "polls": 0}
    log(f"requestReturnMachines {request_id}: {len(ids)} machines")
    return {"requestId": request_id, "message": "Delete VM success."}


def get_request_status(request, conf):
    boot_polls = int(conf.get("BOOT_POLLS", 1))
    answers = []
    with State() as state:
        for ref in request["requests"]:
            request_id = ref["requestId"]
            record = state["requests"].get(request_id)
            if record is None:
                answers.append(
                    {
                        "requestId": request_id,
                        "status": "complete_with_error",
                        "message": "Request not found",
                        "machines": [],
                    }
                )
                continue
            record["polls"] += 1
            if record["kind"] == "create":
                answers.append(create_status(state, request_id, record, boot_polls))
            else:
                answers.append(return_status(state, request_id, record))
    return {"requests": answers}


def create_status(state, request_id, record, boot_polls):
    machines = []
    for machine_id in record["machines"]:
        m = state["machines"][machine_id]
        if m["status"] == "pending" and record["polls"] > boot_polls:
            m["status"] = "running"
        result = {"pending": "executing", "running": "succeed"}.get(m["status"], "succeed")
        machines.append(
            {
                "machineId": machine_id,
                "name": m["name"],
                "result": result,
                "status": m["status"],
                "privateIpAddress": m["ip"],
                "publicIpAddress": None,
                "launchtime": m["launchtime"],
                "message": "",
            }
        )
    if any(x["result"] == "executing" for x in machines):
        return {"requestId": request_id, "status": "running", "message": ""}  # LSF plugins often omit machines here
    return {"requestId": request_id, "status": "complete", "message": "", "machines": machines}


def return_status(state, request_id, record):
    machines = [
        {
            "machineId": machine_id,
            "name": state["machines"][machine_id]["name"],
            "result": "succeed",
            "status": "terminated",
            "privateIpAddress": state["machines"][machine_id]["ip"],
            "launchtime": state["machines"][machine_id]["launchtime"],
            "message": "",
        }
        for machine_id in record["machines"]
    ]
    return {"requestId": request_id, "status": "complete", "message": "", "machines": machines}


def get_return_requests(request, conf):
    wanted = int(conf.get("RECLAIM_COUNT", 0))
    grace = int(conf.get("RECLAIM_GRACE", 120))
    now = time.time()
    answers = []
    with State() as state:
        machines = state["machines"]
        reclaimed = [k for k, m in machines.items() if m["reclaimed_at"] is not None]
        running = sorted(
            (m["launchtime"], k) for k, m in machines.items() if m["status"] == "running" and m["reclaimed_at"] is None
        )
        for _, machine_id in running[: max(0, wanted - len(reclaimed))]:
            machines[machine_id]["reclaimed_at"] = now
            log(f"machine {machine_id} is being reclaimed by the cloud")
        for m in machines.values():
            if m["reclaimed_at"] is not None and m["status"] != "terminated":
                left = max(0, int(grace - (now - m["reclaimed_at"])))
                answers.append({"machine": m["name"], "gracePeriod": left})
        for ref in request.get("machines", []):
            if ref["machineId"] not in machines:
                answers.append({"machine": ref["name"], "gracePeriod": 0})  # gone: LSF should clean it up
    return {"status": "complete", "message": "", "requests": answers}


HANDLERS = {
    "getAvailableTemplates": get_available_templates,
    "requestMachines": request_machines,
    "requestReturnMachines": request_return_machines,
    "getRequestStatus": get_request_status,
    "getReturnRequests": get_return_requests,
}


def main(argv):
    if len(argv) != 4 or argv[1] not in ACTIONS or argv[2] != "-f":
        print(json.dumps({"message": "usage: lsfexample.py <action> -f <input.json>"}))
        return 2
    action, path = argv[1], argv[3]
    os.makedirs(DATA, exist_ok=True)
    conf = settings()
    if conf.get("LOG_INPUTS"):
        keep_input(action, path)
    with open(path) as f:
        request = json.load(f)
    try:
        answer = HANDLERS[action](request, conf)
    except Refused as exc:
        log(f"{action} refused: {exc}")
        print(json.dumps({"message": str(exc)}))
        return 1
    if answer is not None:
        print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
