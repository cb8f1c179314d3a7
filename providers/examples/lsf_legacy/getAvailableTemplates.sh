#!/bin/sh
# LSF resource connector script: getAvailableTemplates -f <input.json>; JSON on stdout, exit 0 on success.
exec python3 -S "$(dirname "$0")/lsfexample.py" getAvailableTemplates "$@"
