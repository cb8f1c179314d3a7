#!/usr/bin/env bash
# requestMachines: create template.machineCount machines, tagged with the caller's owner tags.
#
# The same op_id again must give the same request and the same machines, never new ones: the daemon retries a
# call whose outcome it does not know (timeout, crash) with the same op_id.
source "$(dirname "$0")/lib.sh"
read_args "$@"

{
    IFS= read -r template
    IFS= read -r count
    IFS= read -r op_id
    IFS= read -r cluster
} < <(get_each template.templateId template.machineCount op_id tags.provisionerd:cluster) || true  # absent fields are checked below
[[ -n $template ]] || fail invalid_request "template.templateId is required"
max=$(template_max "$template") || fail invalid_request "unknown template $template"
[[ $count =~ ^[1-9][0-9]{0,3}$ ]] || fail invalid_request "template.machineCount must be a whole number from 1"
valid_op_id "$op_id" || fail invalid_request "op_id must be 1-64 characters of [A-Za-z0-9._:-]"
[[ -n $cluster ]] || fail invalid_request "tags must carry provisionerd:cluster"
tags=$(get -j tags)
mapfile -t instances < <(get -j 'bootstrap.*.instanceRef' || true)
((${#instances[@]} == count)) ||
    fail invalid_request "bootstrap: expected one entry per machine ($count), got ${#instances[@]}"

lock

# A replay: answer with the request this op_id already made.
fingerprint="create $template $count"
check_replay "$op_id" "$fingerprint"
if [[ -n $REPLAY ]]; then
    printf '{"requestId": "%s", "message": "op_id already requested: same request, no new machines"}\n' "$REPLAY"
    exit 0
fi

# maxNumber caps the live machines of a template.
live=0
for record in "$DATA"/machines/*.json; do
    [[ -e $record && ! -e ${record%.json}.returned ]] || continue
    if [[ $(<"${record%.json}.template") == "$template" ]]; then live=$((live + 1)); fi
done
((live + count <= max)) || fail quota_exceeded "template $template: $live live + $count > maxNumber $max"

request_id=$(printf 'req-%06d' "$(next_number)")
: >"$DATA/requests/$request_id"
quoted_template=$(json_quote "$template")
i=0
# The join tokens are secrets: we keep only their SHA-256 (as a machine's proof that it got its bootstrap), and
# they move through a pipe and the printf builtin, never through a command line (argv is public).
get 'bootstrap.*.joinToken' | while IFS= read -r token; do
    n=$(next_number)
    id=$(printf 'bash-%06d' "$n")
    printf '%s' "$token" | sha256sum | cut -d' ' -f1 >"$DATA/machines/$id.token-sha256"
    echo "$template" >"$DATA/machines/$id.template"
    # The machine's tags: the caller's owner tags plus provisionerd:instance (drop the closing brace, append).
    printf '{"machineId":"%s","name":"%s","privateIpAddress":"10.99.%d.%d","launchtime":%d,"templateId":%s,"instanceRef":%s,"tags":%s,"provisionerd:instance":%s}}\n' \
        "$id" "$id.example.internal" $((n / 256 % 256)) $((n % 256)) "$(date +%s)" "$quoted_template" \
        "${instances[i]}" "${tags%\}}" "${instances[i]}" >"$DATA/machines/$id.json"
    echo "$id" >>"$DATA/requests/$request_id"
    i=$((i + 1))
done
# The op_id record is written last: it is what makes a replay find this request. (Were we killed before this
# line, the machines above carry the op_id tag, and the daemon's listMachines check finds them.)
printf '%s\n%s\n' "$request_id" "$fingerprint" >"$DATA/ops/$op_id"

printf '{"requestId": "%s", "message": "requested %d x %s"}\n' "$request_id" "$count" "$template"
