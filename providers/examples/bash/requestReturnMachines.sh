#!/usr/bin/env bash
# requestReturnMachines: give machines back. Returning a machine twice, or one we never had, is harmless. A
# machine whose provisionerd:cluster tag is not the caller's is never touched.
source "$(dirname "$0")/lib.sh"
read_args "$@"

{
    IFS= read -r op_id
    IFS= read -r cluster
} < <(get_each op_id tags.provisionerd:cluster) || true  # absent fields are checked below
valid_op_id "$op_id" || fail invalid_request "op_id must be 1-64 characters of [A-Za-z0-9._:-]"
[[ -n $cluster ]] || fail invalid_request "tags must carry provisionerd:cluster"
ids=$(get 'machines.*.machineId') || fail invalid_request "machines: expected a non-empty list"
mapfile -t names < <(get -j 'machines.*.name')

lock

fingerprint="return $(sort <<<"$ids" | sha256sum | cut -c1-64)"
check_replay "$op_id" "$fingerprint"
if [[ -n $REPLAY ]]; then
    printf '{"requestId": "%s", "message": "op_id already requested: same return request"}\n' "$REPLAY"
    exit 0
fi

# Which of the asked machines exist, and which of those are the caller's (one tags_match call for all).
known=()
while IFS= read -r id; do
    if [[ $id =~ ^bash-[0-9]{6}$ && -f $DATA/machines/$id.json ]]; then known+=("$DATA/machines/$id.json"); fi
done <<<"$ids"
declare -A owned=()
if ((${#known[@]})); then
    while IFS= read -r record; do owned[$record]=1; done < <(tags_match "{\"provisionerd:cluster\":$(json_quote "$cluster")}" "${known[@]}")
fi

request_id=$(printf 'ret-%06d' "$(next_number)")
i=0
while IFS= read -r id; do
    record=$DATA/machines/$id.json
    if [[ -n ${owned[$record]:-} ]]; then
        [[ -e $DATA/machines/$id.returned ]] || echo "$request_id" >"$DATA/machines/$id.returned"
        machine_doc "$id" succeed terminated
    elif [[ $id =~ ^bash-[0-9]{6}$ && -f $record ]]; then
        machine_doc "$id" fail running "not returned: it belongs to another cluster"
    else
        printf '{"machineId":%s,"name":%s,"result":"succeed","status":"terminated","message":"no such machine: nothing to return"}\n' \
            "$(json_quote "$id")" "${names[i]}"
    fi
    i=$((i + 1))
done <<<"$ids" >"$DATA/requests/$request_id.json"
printf '%s\n%s\n' "$request_id" "$fingerprint" >"$DATA/ops/$op_id"

printf '{"requestId": "%s", "message": "returning %d machine(s)"}\n' "$request_id" "$i"
