"""Entry point of the Slurm provider plugin: ``run.py oneshot <action> -f in.json`` or ``run.py persistent``.

Run with the project's interpreter (``$PROVISIONERD_PYTHON``, else ``python3``): it imports ``provisionerd`` (for
the contract schemas) plus attrs and jsonschema. The wrappers next to this file are what the daemon starts.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    from slurm_plugin import transport
    from slurm_plugin.errors import PluginError
    from slurm_plugin.plugin import Plugin

    transport.setup_logging()
    args = sys.argv[1:]
    if args[:1] in (["persistent"], ["oneshot"]) and (len(args) == 1 if args[0] == "persistent" else len(args) >= 2):
        try:
            load = Plugin.from_environment()
        except PluginError as err:
            load = err
        if args[0] == "persistent":
            sys.exit(transport.persistent(load))
        sys.exit(transport.oneshot(load, args[1], args[2:]))
    print("usage: run.py persistent | run.py oneshot <action> -f <input.json>", file=sys.stderr)
    sys.exit(2)
