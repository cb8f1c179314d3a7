#!/bin/sh
# One-shot transport: requestReturnMachines.sh -f <input.json>; the result (or an error document) on stdout.
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd) || exit 1
exec "${PROVISIONERD_PYTHON:-python3}" "$here/run.py" oneshot requestReturnMachines "$@"
