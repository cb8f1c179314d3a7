#!/usr/bin/env bash
# One-shot entry for listLicenses (usage: listLicenses.sh -f IN.json). See run.py.
exec "${PROVISIONERD_PYTHON:-python3}" -S "$(dirname "$0")/run.py" oneshot listLicenses "$@"
