#!/usr/bin/env bash
# listMachines: every live machine carrying all the given tags. The daemon's orphan scan and its op_id retry
# check rely on this listing, so it must show everything we created and have not returned.
# Paged: at most pageSize machines in machineId order after cursor, and nextCursor (the page's last id) when
# more follow (docs/providers.md, "Paging"). Without pageSize, everything in one answer.
source "$(dirname "$0")/lib.sh"
read_args "$@"

filter=$(get -j tags) || fail invalid_request "tags: a filter naming provisionerd:cluster is required"
get 'tags.provisionerd:cluster' >/dev/null || fail invalid_request "tags must name provisionerd:cluster"
{ read -r cursor; read -r size; } < <(get_each cursor pageSize)
[[ -z $size || $size =~ ^[1-9][0-9]*$ ]] || fail invalid_request "pageSize: expected an integer >= 1, got $size"
lock

live=()
for record in "$DATA"/machines/*.json; do
    if [[ -e $record && ! -e ${record%.json}.returned ]]; then live+=("$record"); fi
done
list_page "$filter" "$cursor" "$size" "${live[@]}"
