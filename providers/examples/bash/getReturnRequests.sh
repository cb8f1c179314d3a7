#!/usr/bin/env bash
# getReturnRequests: the machines the provider wants back (a cloud reclaiming spot capacity, say).
# Our records are never reclaimed, so the answer is always an empty list: one page, whatever cursor or pageSize
# the daemon sends (docs/providers.md, "Paging").
source "$(dirname "$0")/lib.sh"
read_args "$@"

echo '{"status": "complete", "message": "", "requests": []}'
