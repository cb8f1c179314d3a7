"""Entry point of the simulated provider: ``run.py oneshot ACTION -f IN.json`` or ``run.py persistent``.

The shell wrappers (``<action>.sh``, ``provider``) run this with ``"${PROVISIONERD_PYTHON:-python3}" -S``: no
site-packages, which both speeds up start-up and proves the plugin needs nothing beyond the standard library and
the plugin SDK (``provisionerd.plugin_sdk``, of the provisionerd that ships this plugin: found below).
"""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOTS = (f"{HERE}/../..", f"{HERE}/../../../..")  # the checkout; the installed wheel's site-packages
sys.path[1:1] = [root for root in ROOTS if os.path.isdir(f"{root}/provisionerd/plugin_sdk")][:1]

if __name__ == "__main__":
    from simprovider import oneshot, persistent

    args = sys.argv[1:]
    if args[:1] == ["oneshot"]:
        sys.exit(oneshot.main(args[1:]))
    if args[:1] == ["persistent"]:
        sys.exit(persistent.main(args[1:]))
    print("usage: run.py oneshot ACTION -f IN.json | run.py persistent", file=sys.stderr)
    sys.exit(2)
