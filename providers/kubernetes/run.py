"""Entry point of the Kubernetes provider plugin: ``run.py persistent`` (JSON lines) or ``run.py status``.

Run with the project's interpreter (``$PROVISIONERD_PYTHON``, else ``python3``): it imports ``provisionerd`` (the
plugin SDK and the contract schemas), the official ``kubernetes`` client (the ``kubernetes`` extra), attrs and
jsonschema. ``run.py status`` prints the status split (access, connectivity, readiness, capacity) as JSON and exits
0 when every part is ok.
"""

import json
import os
import sys

# The provisionerd that ships this plugin: the checkout (providers/kubernetes) or the wheel's site-packages
# (provisionerd/resources/providers/kubernetes), ahead of any other on the path.
HERE = os.path.dirname(os.path.realpath(__file__))
ROOTS = (f"{HERE}/../..", f"{HERE}/../../../..")
sys.path[1:1] = [root for root in ROOTS if os.path.isdir(f"{root}/provisionerd/plugin_sdk")][:1]


def load():
    """The plugin, or why it cannot run (a missing client library is ``provider_error`` naming the extra)."""
    from provisionerd.plugin_sdk.errors import PluginError

    try:
        from k8s_plugin.plugin import Plugin
    except ImportError as exc:
        raise PluginError("provider_error", f"cannot import {exc.name!r}: install provisionerd[kubernetes]") from None
    return Plugin.from_environment()


if __name__ == "__main__":
    from provisionerd.plugin_sdk.calls import load_plugin
    from provisionerd.plugin_sdk.entry import main
    from provisionerd.plugin_sdk.errors import PluginError

    args = sys.argv[1:]
    if args == ["persistent"]:  # persistent only: the plugin ships no one-shot scripts
        sys.exit(main(load, args, "k8s-plugin"))
    if args != ["status"]:
        print("usage: run.py persistent | run.py status", file=sys.stderr)
        sys.exit(2)
    plugin = load_plugin(load)
    if isinstance(plugin, PluginError):
        print(json.dumps({"error": plugin.document()}))
        sys.exit(1)
    from k8s_plugin.health import status_report

    report = status_report(plugin)
    print(json.dumps(report, indent=2))
    sys.exit(0 if all(part["ok"] for part in report.values()) else 1)
