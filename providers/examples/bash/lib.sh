# shellcheck shell=bash
# Shared helpers of the bash example provider; every <action>.sh sources this file.
#
# The provider keeps its "machines" as records in $PRO_DATA_DIR:
#   machines/<id>.json      one JSON record per machine (id, name, address, launch time, instance ref, tags)
#   machines/<id>.template  its template id (to count live machines per template without parsing JSON)
#   machines/<id>.token-sha256  the SHA-256 of its join token (never the token itself)
#   machines/<id>.returned  present once the machine was returned (it holds the return request id)
#   requests/<id>           a create request: one machine id per line
#   requests/<id>.json      a return request: one finished machine status document per line
#   ops/<op_id>             the request an op_id produced, then what was asked: the op_id idempotency index
#   counter                 the last number handed out (ids are bash-000001, req-000002, ...)
#
# Bash cannot parse JSON, and CI guarantees only bash, coreutils and python3, so reading JSON goes through one
# small python helper (json_get below). Everything we *write* is built with printf from values we either made
# ourselves (ids, numbers) or that json_get already quoted as JSON (-j).

set -euo pipefail

PY=${PROVISIONERD_PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=${PRO_DATA_DIR:?PRO_DATA_DIR must be set}
mkdir -p "$DATA/machines" "$DATA/requests" "$DATA/ops"

# fail CODE MESSAGE: print the contract's typed error document on stdout and exit 1.
# capacity_unavailable and throttled are the retryable codes.
fail() {
    local retryable=false
    [[ $1 == capacity_unavailable || $1 == throttled ]] && retryable=true
    printf '{"error": {"code": "%s", "message": %s, "retryable": %s}}\n' "$1" "$(json_quote "$2")" "$retryable"
    exit 1
}

# read_args "$@": the one-shot calling convention is "<action>.sh -f <input.json>"; sets INPUT.
read_args() {
    [[ $# -eq 2 && $1 == -f && -r $2 ]] || fail invalid_request "usage: $(basename "$0") -f INPUT.json"
    INPUT=$2
}

# json_get [-j] FILE PATH: print the value at PATH ("template.machineCount", "bootstrap.0.instanceRef",
# "requests.*.requestId" where * walks a list, one value per line). Strings print raw, other values as compact
# JSON; with -j every value prints as JSON (strings quoted). Exit status 1 when the path is absent.
JSON_GET='
import json, sys
as_json, (path, dotted) = sys.argv[1] == "-j", sys.argv[2:4]
values = [json.load(open(path))]
for key in dotted.split(".") if dotted else []:
    nxt = []
    for v in values:
        if key == "*" and isinstance(v, list):
            nxt.extend(v)
        elif isinstance(v, dict) and key in v:
            nxt.append(v[key])
        elif isinstance(v, list) and key.isdigit() and int(key) < len(v):
            nxt.append(v[int(key)])
    values = nxt
for v in values:
    print(v if isinstance(v, str) and not as_json else json.dumps(v, separators=(",", ":")))
sys.exit(0 if values else 1)
'
json_get() {
    local mode=-r
    if [[ $1 == -j ]]; then mode=-j; shift; fi
    "$PY" -S -c "$JSON_GET" "$mode" "$1" "$2"
}

# get [-j] PATH: json_get on this call's input.
get() {
    if [[ $1 == -j ]]; then json_get -j "$INPUT" "$2"; else json_get "$INPUT" "$1"; fi
}

# get_each PATH...: the value at each PATH of the input (dotted, no *), one line each, an empty line when absent:
# one python start instead of one per field. Read them with { read -r a; read -r b; } < <(get_each ...).
JSON_EACH='
import json, sys
doc = json.load(open(sys.argv[1]))
for dotted in sys.argv[2:]:
    v = doc
    for key in dotted.split("."):
        v = v.get(key) if isinstance(v, dict) else None
    print("" if v is None else v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
'
get_each() {
    "$PY" -S -c "$JSON_EACH" "$INPUT" "$@"
}

# json_quote TEXT: TEXT as a JSON string literal (pure bash: escape \ and ", spell out newlines and tabs, drop
# any other control character).
json_quote() {
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/\\r}
    printf '"%s"' "${s//[[:cntrl:]]/}"
}

# templates_file: where our templates are: $PRO_CONF_DIR/templates.json when an operator put one there.
templates_file() {
    if [[ -n ${PRO_CONF_DIR:-} && -f $PRO_CONF_DIR/templates.json ]]; then
        echo "$PRO_CONF_DIR/templates.json"
    else
        echo "$HERE/templates.json"
    fi
}

# template_max ID: the maxNumber of template ID; exit status 1 when we do not offer it.
template_max() {
    "$PY" -S -c '
import json, sys
found = [t["maxNumber"] for t in json.load(open(sys.argv[1]))["templates"] if t["templateId"] == sys.argv[2]]
print(found[0]) if found else sys.exit(1)
' "$(templates_file)" "$1"
}

# tags_match FILTER_JSON RECORD...: print the records (paths) whose machine carries every tag in FILTER_JSON.
tags_match() {
    "$PY" -S -c '
import json, sys
wanted = json.loads(sys.argv[1]).items()
for path in sys.argv[2:]:
    tags = json.load(open(path))["tags"]
    if all(tags.get(k) == v for k, v in wanted):
        print(path)
' "$@"
}

# list_page FILTER_JSON CURSOR SIZE RECORD...: the listMachines answer for the records (paths) whose machine
# carries every tag in FILTER_JSON: keyset paging in machineId order (CURSOR and SIZE may be empty: the first page,
# no limit), with nextCursor when more follow. Each entry is the record plus its status.
list_page() {
    "$PY" -S -c '
import json, sys
wanted, cursor, size = json.loads(sys.argv[1]).items(), sys.argv[2], sys.argv[3]
found = []
for path in sys.argv[4:]:
    record = json.load(open(path))
    if all(record["tags"].get(k) == v for k, v in wanted) and record["machineId"] > cursor:
        found.append({**record, "status": "running"})
found.sort(key=lambda m: m["machineId"])
answer = {"machines": found}
if size and len(found) > int(size):
    answer = {"machines": found[: int(size)], "nextCursor": found[int(size) - 1]["machineId"]}
print(json.dumps(answer, separators=(",", ":")))
' "$@"
}

# lock: take the provider's lock until this script exits (separate one-shot calls must not interleave).
# mkdir is atomic, and unlike flock it is in coreutils. A holder killed with SIGKILL leaves its lock behind:
# it is broken when the pid written inside no longer runs.
lock() {
    local dir=$DATA/lock pid
    until mkdir "$dir" 2>/dev/null; do
        pid=$(cat "$dir/pid" 2>/dev/null || true)
        if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
            rm -rf "$dir"
            continue
        fi
        sleep 0.05
    done
    echo $$ >"$dir/pid"
    trap 'rm -rf "$DATA/lock"' EXIT
}

# next_number: the next number from the counter (call with the lock held).
next_number() {
    local n=0
    [[ -f $DATA/counter ]] && n=$(<"$DATA/counter")
    n=$((n + 1))
    echo "$n" >"$DATA/counter"
    echo "$n"
}

# valid_op_id OP_ID: the op_id is also a file name under ops/, so check its shape (the contract's pattern).
valid_op_id() {
    [[ $1 =~ ^[A-Za-z0-9._:-]{1,64}$ && $1 != . && $1 != .. ]]
}

# check_replay OP_ID FINGERPRINT: when OP_ID was used before, set REPLAY to the request it made; otherwise
# REPLAY is empty. The same op_id for a different ask is the caller's bug, refused (clouds do the same with
# client tokens).
# shellcheck disable=SC2034  # REPLAY is read by the scripts that source this file
check_replay() {
    REPLAY=
    [[ -f $DATA/ops/$1 ]] || return 0
    [[ $(sed -n 2p "$DATA/ops/$1") == "$2" ]] || fail invalid_request "op_id $1 was already used for a different request"
    REPLAY=$(head -n1 "$DATA/ops/$1")
}

# join_lines: join stdin lines with commas (to build JSON lists).
join_lines() {
    paste -sd, -
}

# machine_doc ID RESULT STATUS [MESSAGE]: a machine's record plus its result and status (a getRequestStatus
# entry). The record is a JSON object, so dropping its closing brace lets us append fields.
machine_doc() {
    local record
    record=$(<"$DATA/machines/$1.json")
    printf '%s,"result":"%s","status":"%s","message":"%s"}\n' "${record%\}}" "$2" "$3" "${4:-}"
}
