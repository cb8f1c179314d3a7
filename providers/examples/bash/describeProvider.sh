#!/usr/bin/env bash
# describeProvider: who we are and which contract features we really support.
source "$(dirname "$0")/lib.sh"
read_args "$@"

cat <<JSON
{"name": "bash-example", "version": "1.0.0", "contractVersion": 1,
 "features": {"idempotentRequest": true, "listMachines": true, "stopMachines": false, "tags": true,
              "priceQuotes": false}}
JSON
