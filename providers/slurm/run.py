"""Entry point of the Slurm provider plugin: ``run.py oneshot <action> -f in.json`` or ``run.py persistent``.

Run with the project's interpreter (``$PROVISIONERD_PYTHON``, else ``python3``): it imports ``provisionerd`` (the
plugin SDK and the contract schemas) plus attrs and jsonschema. The wrappers next to this file are what the daemon
starts.
"""

import os
import sys

# The provisionerd that ships this plugin: the checkout (providers/slurm) or the wheel's site-packages
# (provisionerd/resources/providers/slurm), ahead of any other on the path.
HERE = os.path.dirname(os.path.realpath(__file__))
ROOTS = (f"{HERE}/../..", f"{HERE}/../../../..")
sys.path[1:1] = [root for root in ROOTS if os.path.isdir(f"{root}/provisionerd/plugin_sdk")][:1]

if __name__ == "__main__":
    from slurm_plugin.plugin import Plugin

    from provisionerd.plugin_sdk.entry import main

    sys.exit(main(Plugin.from_environment, sys.argv[1:], "slurm-plugin"))
