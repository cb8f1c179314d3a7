"""A plugin's command line: ``run.py persistent`` or ``run.py oneshot ACTION -f IN.json``.

The plugin's own ``run.py`` (the process the daemon starts, through its ``provider`` and ``<action>.sh`` wrappers)
calls ``main`` with the function that makes its plugin object; ``main`` sets up the scrubbed stderr log and runs the
transport the arguments ask for. A usage error prints the usage on stderr and returns 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from provisionerd.plugin_sdk.calls import Handler
from provisionerd.plugin_sdk.lines import MAX_IN_FLIGHT, serve_lines
from provisionerd.plugin_sdk.logs import setup_logging
from provisionerd.plugin_sdk.oneshot import serve_oneshot
from provisionerd.plugin_sdk.redact import Redactor

USAGE = "usage: run.py persistent | run.py oneshot ACTION -f IN.json"


def main(
    factory: Callable[[], Handler],
    argv: list[str],
    log_prefix: str,
    redactor: Redactor | None = None,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> int:
    """Run the transport ``argv`` (``sys.argv[1:]``) names; returns the exit status."""
    redactor = setup_logging(log_prefix, redactor)
    if argv == ["persistent"]:
        return serve_lines(factory, redactor, max_in_flight=max_in_flight)
    if argv[:1] == ["oneshot"] and len(argv) >= 2:
        return serve_oneshot(factory, argv[1], argv[2:], redactor)
    print(USAGE, file=sys.stderr)
    return 2
