"""A template's capability probes, as a plugin passes them to its machines' agents (``provisionerd agent --probe``,
``--reprobe-interval``; docs/fleet.md "Capabilities verified by default").

A plugin takes ``probes`` (``{name: shell command}``) and ``reprobeInterval`` from its own template config, never
from a request, and passes each probe to the agent as one argument. :func:`probe_problem` is what every plugin
checks them by, beyond its schema: the agent's own limits, said clearly (a schema's messages quote the value first
and are cut)."""

from __future__ import annotations

from collections.abc import Mapping

#: The most probes a template may have: the agent reports 4 entries of its own (ncpus, mem, type, ngpus) and the
#: controller keeps 8.
MAX_PROBES = 4
#: The longest probe command, in characters.
MAX_COMMAND = 1024
#: The names the agent reports itself, which a probe cannot replace (``ngpus`` it can: another vendor's tool).
BUILT_IN = ("ncpus", "mem", "type")
#: ``reprobeInterval``'s bounds besides 0 (never), the agent's.
MIN_REPROBE, MAX_REPROBE = 10.0, 86400.0


def probe_problem(probes: Mapping[str, str], reprobe_interval: float | None) -> str | None:
    """What is wrong with a template's ``probes`` and ``reprobeInterval`` (``None``: nothing): how many, no name the
    agent reports itself, each command one non-blank line (no CR, LF or NUL) of at most ``MAX_COMMAND``
    characters, and the interval 0 or from ``MIN_REPROBE`` to ``MAX_REPROBE`` seconds."""
    if len(probes) > MAX_PROBES:
        return f"probes: at most {MAX_PROBES}, not {len(probes)}"
    for name, command in probes.items():
        if len(command) > MAX_COMMAND:
            return f"probes.{name}: the command is longer than {MAX_COMMAND} characters"
        if name in BUILT_IN:
            return f"probes.{name}: the agent reports {name!r} itself; a probe cannot replace it"
        if not command.strip():
            return f"probes.{name}: the command is blank"
        if any(c in command for c in "\r\n\0"):
            return f"probes.{name}: the command must be one line (no CR, LF or NUL)"
    interval = reprobe_interval
    if interval is not None and interval != 0 and not MIN_REPROBE <= interval <= MAX_REPROBE:
        return f"reprobeInterval: expected 0 (never) or {MIN_REPROBE:g} to {MAX_REPROBE:g} seconds, got {interval:g}"
    return None
