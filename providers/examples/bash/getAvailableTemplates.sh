#!/usr/bin/env bash
# getAvailableTemplates: the machine shapes we offer. templates.json is already the answer; an operator can put
# their own in $PRO_CONF_DIR/templates.json.
source "$(dirname "$0")/lib.sh"
read_args "$@"

cat "$(templates_file)"
