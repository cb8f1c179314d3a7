"""Entry point of the Kubernetes provider plugin: ``run.py persistent`` (JSON lines) or ``run.py status``.

Run with the project's interpreter (``$PROVISIONERD_PYTHON``, else ``python3``): it imports ``provisionerd`` (for
the contract schemas), the official ``kubernetes`` client (the ``kubernetes`` extra), attrs and jsonschema.
``run.py status`` prints the status split (access, connectivity, readiness, capacity) as JSON and exits 0 when
every part is ok.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    from k8s_plugin import transport
    from k8s_plugin.errors import PluginError

    transport.setup_logging()
    args = sys.argv[1:]
    if args in (["persistent"], ["status"]):
        try:
            from k8s_plugin.plugin import Plugin

            load = Plugin.from_environment()
        except PluginError as err:
            load = err
        except ImportError as exc:
            load = PluginError("provider_error", f"cannot import {exc.name!r}: install provisionerd[kubernetes]")
        if args[0] == "persistent":
            sys.exit(transport.persistent(load))
        if isinstance(load, PluginError):
            print(json.dumps({"error": load.document()}))
            sys.exit(1)
        from k8s_plugin.health import status_report

        report = status_report(load)
        print(json.dumps(report, indent=2))
        sys.exit(0 if all(part["ok"] for part in report.values()) else 1)
    print("usage: run.py persistent | run.py status", file=sys.stderr)
    sys.exit(2)
