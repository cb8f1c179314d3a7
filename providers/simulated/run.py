"""Entry point of the simulated provider: ``run.py oneshot ACTION -f IN.json`` or ``run.py persistent``.

The shell wrappers (``<action>.sh``, ``provider``) run this with ``"${PROVISIONERD_PYTHON:-python3}" -S``: no
site-packages, which both speeds up start-up and proves the plugin needs nothing beyond the standard library.
"""

import sys

from simprovider import oneshot, persistent

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["oneshot"]:
        sys.exit(oneshot.main(args[1:]))
    if args[:1] == ["persistent"]:
        sys.exit(persistent.main(args[1:]))
    print("usage: run.py oneshot ACTION -f IN.json | run.py persistent", file=sys.stderr)
    sys.exit(2)
