"""One-shot transport: ``<action>.sh -f in.json`` -> one JSON document on stdout, exit 0 on success.

A refusal is the error document ``{"error": {...}}`` on stdout with exit 1, as LSF plugins report failure. The
state file is locked for the read-modify-write only, never while a slow or hung call waits.
"""

from __future__ import annotations

import json
import os
import sys
import time

from . import config as config_mod
from . import engine
from .errors import Fault
from .store import Store

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_CRASH = 70
GARBAGE = b"simulated garbage output: <<<this is not JSON>>>\n"


def _emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _read_input(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise Fault("invalid_request", f"cannot read input file {path}: {e.strerror}") from None
    except ValueError as e:
        raise Fault("invalid_request", f"input file is not valid JSON: {e}") from None


def run(action: str, input_path: str, env: dict) -> int:
    try:
        inp = _read_input(input_path)
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
    except Fault as fault:
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
    if len(argv) != 3 or argv[1] != "-f":
        print(f"usage: <action>.sh -f INPUT.json (got {argv[1:]!r})")
        return EXIT_USAGE
    return run(argv[0], argv[2], dict(os.environ))
