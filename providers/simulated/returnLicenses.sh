#!/usr/bin/env bash
# One-shot entry for returnLicenses (usage: returnLicenses.sh -f IN.json). See run.py.
exec "${PROVISIONERD_PYTHON:-python3}" -S "$(dirname "$0")/run.py" oneshot returnLicenses "$@"
