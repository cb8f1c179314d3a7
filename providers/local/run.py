"""Entry point of the local provider: ``run.py oneshot ACTION -f IN.json`` or ``run.py persistent``.

The wrappers run it with ``"${PROVISIONERD_PYTHON:-python3}" -S``: the plugin itself needs only the standard
library; the agents it starts run ``<that python> -m provisionerd agent`` with the project installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from localprovider import transports  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["oneshot"]:
        sys.exit(transports.oneshot(args[1:]))
    if args[:1] == ["persistent"]:
        sys.exit(transports.persistent(args[1:]))
    print("usage: run.py oneshot ACTION -f IN.json | run.py persistent", file=sys.stderr)
    sys.exit(2)
