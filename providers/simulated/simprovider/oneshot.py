"""One-shot transport: ``<action>.sh -f in.json`` -> one JSON document on stdout, exit 0 on success.

A refusal is the error document ``{"error": {...}}`` on stdout with exit 1, as LSF plugins report failure. The
state file is locked for the read-modify-write only, never while a slow or hung call waits.

Not the SDK's ``serve_oneshot`` (it reads its input with the SDK's ``read_input``): this transport must also
misbehave on purpose, as the scripted faults say (hang, half an answer then death, garbage on stdout), which the
SDK's transports never do.
"""

from __future__ import annotations

import json
import os
import sys
import time

from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.oneshot import read_input

from . import config as config_mod
from . import engine
from .store import Store

EXIT_REFUSED = 1
EXIT_USAGE = 2  # no action named at all
EXIT_CRASH = 70
GARBAGE = b"simulated garbage output: <<<this is not JSON>>>\n"


def _emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def run(action: str, argv: list[str], env: dict) -> int:
    try:
        inp = read_input(argv)
        config = config_mod.load(env)
        store = Store.from_env(env)
        store.lock()
        try:
            state = store.load(engine.new_state)
            outcome = engine.handle(config, state, action, inp, time.time())
            if outcome.change:
                store.save(state, durable=outcome.change == engine.DURABLE)
        finally:
            store.unlock()
    except PluginError as fault:
        _emit({"error": fault.document()})
        return EXIT_REFUSED
    if outcome.delay:
        time.sleep(outcome.delay)
    if outcome.disrupt == "hang":
        while True:  # the daemon's timeout kills our process group
            time.sleep(3600)
    answer = {"error": outcome.error} if outcome.error is not None else outcome.result
    if outcome.disrupt == "garbage":
        sys.stdout.buffer.write(GARBAGE)
        sys.stdout.flush()
        return 0
    if outcome.disrupt == "crash":
        text = json.dumps(answer).encode()
        sys.stdout.buffer.write(text[: len(text) // 2])  # half an answer, then gone
        sys.stdout.flush()
        os._exit(EXIT_CRASH)
    _emit(answer)
    return 0 if outcome.error is None else EXIT_REFUSED


def main(argv: list[str]) -> int:
    """``argv``: ``ACTION -f IN.json``; a usage error is an ``invalid_request`` document, exit 1."""
    return run(argv[0], argv[1:], dict(os.environ)) if argv else EXIT_USAGE
