#!/bin/sh
# LSF resource connector script: requestReturnMachines -f <input.json>; JSON on stdout, exit 0 on success.
exec python3 -S "$(dirname "$0")/lsfexample.py" requestReturnMachines "$@"
