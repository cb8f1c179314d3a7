"""Entry point of the local provider: ``run.py oneshot ACTION -f IN.json`` or ``run.py persistent``.

The wrappers run it with ``"${PROVISIONERD_PYTHON:-python3}" -S``: the plugin itself needs only the standard
library and the plugin SDK (``provisionerd.plugin_sdk``, found next to this plugin below); the agents it starts run
``<that python> -m provisionerd agent`` with the project installed. Persistent calls are answered one at a time, in
order (each takes the state lock anyway).
"""

import os
import sys

# The provisionerd that ships this plugin: the checkout (providers/local) or the wheel's site-packages
# (provisionerd/resources/providers/local); python -S sees neither on its own.
HERE = os.path.dirname(os.path.realpath(__file__))
ROOTS = (f"{HERE}/../..", f"{HERE}/../../../..")
sys.path[1:1] = [root for root in ROOTS if os.path.isdir(f"{root}/provisionerd/plugin_sdk")][:1]

if __name__ == "__main__":
    from localprovider.actions import Provider

    from provisionerd.plugin_sdk.entry import main

    persistent = sys.argv[1:] == ["persistent"]
    sys.exit(main(lambda: Provider(os.environ, persistent=persistent), sys.argv[1:], "local-provider", None, 1))
