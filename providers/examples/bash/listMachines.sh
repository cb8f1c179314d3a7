#!/usr/bin/env bash
# listMachines: every live machine carrying all the given tags. The daemon's orphan scan and its op_id retry
# check rely on this listing, so it must show everything we created and have not returned.
source "$(dirname "$0")/lib.sh"
read_args "$@"

filter=$(get -j tags) || fail invalid_request "tags: a filter naming provisionerd:cluster is required"
get 'tags.provisionerd:cluster' >/dev/null || fail invalid_request "tags must name provisionerd:cluster"
lock

live=()
for record in "$DATA"/machines/*.json; do
    if [[ -e $record && ! -e ${record%.json}.returned ]]; then live+=("$record"); fi
done
docs=()
if ((${#live[@]})); then
    while IFS= read -r record; do
        fields=$(<"$record")
        docs+=("${fields%\}},\"status\":\"running\"}")  # the record plus its status
    done < <(tags_match "$filter" "${live[@]}")
fi

printf '{"machines":[%s]}\n' "$(printf '%s\n' "${docs[@]}" | join_lines)"
