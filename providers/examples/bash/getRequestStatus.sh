#!/usr/bin/env bash
# getRequestStatus: the state of create (req-*) and return (ret-*) requests. Our machines are records, so they
# are "running" as soon as they exist and "terminated" as soon as they are returned: every request is complete.
source "$(dirname "$0")/lib.sh"
read_args "$@"

ids=$(get 'requests.*.requestId') || fail invalid_request "requests: expected a list of {\"requestId\": ...}"
lock

entries=()
while IFS= read -r id; do
    if [[ $id =~ ^req-[0-9]{6}$ && -f $DATA/requests/$id ]]; then
        docs=()
        while IFS= read -r machine; do
            if [[ -e $DATA/machines/$machine.returned ]]; then
                docs+=("$(machine_doc "$machine" succeed terminated)")
            else
                docs+=("$(machine_doc "$machine" succeed running)")
            fi
        done <"$DATA/requests/$id"
        machines=$(printf '%s\n' "${docs[@]}" | join_lines)
    elif [[ $id =~ ^ret-[0-9]{6}$ && -f $DATA/requests/$id.json ]]; then
        machines=$(join_lines <"$DATA/requests/$id.json")
    else
        entries+=("$(printf '{"requestId":%s,"status":"complete_with_error","message":"unknown request","machines":[]}' \
            "$(json_quote "$id")")")
        continue
    fi
    # A refused machine makes the request complete_with_error. (Names and ids from the caller are JSON-quoted
    # in the documents, so this exact text can only be a result field.)
    status=complete
    [[ $machines == *'"result":"fail"'* ]] && status=complete_with_error
    entries+=("$(printf '{"requestId":"%s","status":"%s","message":"","machines":[%s]}' "$id" "$status" "$machines")")
done <<<"$ids"

printf '{"requests":[%s]}\n' "$(printf '%s\n' "${entries[@]}" | join_lines)"
