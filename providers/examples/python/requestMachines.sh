#!/bin/sh
# One-shot transport: requestMachines.sh -f <input.json>; the answer (or a typed error document) on stdout.
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd) || exit 1
exec "${PROVISIONERD_PYTHON:-python3}" "$here/example_plugin.py" oneshot requestMachines "$@"
