"""Persistent transport: JSON-lines ``{"id", "action", "input"}`` in, ``{"id", "result"|"error"}`` out.

One process, one thread. It reads whatever stdin has (many requests may be in flight), answers each, and writes
all answers of that batch in one ``write``: the per-call cost stays a JSON decode, a dict lookup and a JSON encode.
Slow faults delay only their own answer (a timer heap), so answers can come out of order, as the contract allows.

The state lives in memory and in ``state.json`` (shared with one-shot calls and with the next process):
- before a batch, one ``stat`` tells whether another process replaced the file; if so it is reloaded;
- a call that can create, return, vanish or reclaim machines runs under the file lock and is saved with fsync
  before it is answered;
- soft changes (poll and fault counters) are saved without fsync once per batch. If another process wrote the file
  meanwhile, its version wins and those counters are lost: harmless, they only pace the simulation.
EOF on stdin or SIGTERM saves and exits.

The daemon polls the same settled requests and listings over and over, and encoding a large answer is most of a
call's cost, so the encoded answer of a read-only call that changed nothing is kept until the state next changes
(answers that depend on the clock are kept for the current second only).

Not the SDK's ``serve_lines``: this server must misbehave on purpose at the framing level (delay, hang, garbage,
half an answer then death, as the scripted faults say) and answer a poll in microseconds from its cache.
"""

from __future__ import annotations

import heapq
import json
import os
import select
import signal
import sys
import time

from provisionerd.plugin_sdk.errors import PluginError

from . import config as config_mod
from . import engine
from .oneshot import EXIT_CRASH, GARBAGE
from .store import Store

MAX_LINE = 1 << 20
#: Read-only actions whose answers may be cached -> whether the answer depends on the clock (to the second).
CACHEABLE = {
    "describeProvider": False,
    "getRequestStatus": False,
    "listMachines": False,
    "getAvailableTemplates": True,
    "getReturnRequests": True,
}
MAX_CACHED = 1024
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_loads = json.loads


def _log(message: str) -> None:
    sys.stderr.write(f"simulated: {message}\n")
    sys.stderr.flush()


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _mutating_actions(config: dict) -> frozenset:
    names = {
        "requestMachines",
        "requestReturnMachines",
        "returnLicenses",
        "listLicenses",
    }  # licences: first list writes
    for rule in config["faults"]:
        if rule["kind"] in ("vanish", "reclaim"):
            names.update(config_mod.ACTIONS if "*" in rule["actions"] else rule["actions"])
    return frozenset(names)


class Server:
    def __init__(self, config: dict, store: Store) -> None:
        self.config = config
        self.store = store
        self.mutating = _mutating_actions(config)
        self.cache: dict[tuple, bytes] = {}  # (action, input, second) -> encoded result; cleared on any change
        self.state = self._locked_load()
        self.soft_dirty = False
        self.delayed: list[tuple[float, int, bytes]] = []  # (due, tiebreak, line)
        self.out: list[bytes] = []

    def _locked_load(self) -> dict:
        self.cache.clear()
        self.store.lock()
        try:
            return self.store.load(engine.new_state)
        finally:
            self.store.unlock()

    def save_soft(self) -> None:
        if not self.soft_dirty:
            return
        self.store.lock()
        try:
            if self.store.changed_on_disk():
                self.state = self.store.load(engine.new_state)  # theirs wins, see the module docstring
                self.cache.clear()
            else:
                self.store.save(self.state, durable=False)
        finally:
            self.store.unlock()
        self.soft_dirty = False

    def _call(self, action: str, inp: object) -> engine.Outcome:
        if action not in self.mutating:
            outcome = engine.handle(self.config, self.state, action, inp, time.time())
            if outcome.change:
                self.soft_dirty = True
                self.cache.clear()
            return outcome
        self.cache.clear()
        self.store.lock()
        try:
            if self.store.changed_on_disk():
                self.state = self.store.load(engine.new_state)
                self.soft_dirty = False
            outcome = engine.handle(self.config, self.state, action, inp, time.time())
            if outcome.change:
                self.store.save(self.state, durable=outcome.change == engine.DURABLE)
                self.soft_dirty = False
        finally:
            self.store.unlock()
        return outcome

    def line(self, raw: bytes) -> None:
        """Handle one request line; its answer goes to ``self.out`` or the delay heap (or nowhere: hang)."""
        try:
            msg = _loads(raw)
        except ValueError:
            _log(f"ignoring a line that is not JSON ({len(raw)} bytes)")
            return
        rid = msg.get("id") if isinstance(msg, dict) else None
        if isinstance(rid, bool) or not isinstance(rid, int):
            _log("ignoring a request without an integer id")
            return
        action = msg.get("action")
        if not isinstance(action, str):
            self.out.append(
                _dumps(
                    {"id": rid, "error": PluginError("invalid_request", "action: expected a string").document()}
                ).encode()
                + b"\n"
            )
            return
        inp = msg.get("input", {})
        key = None
        if action in CACHEABLE and action not in self.mutating:
            key = (action, _dumps(inp), int(time.time()) if CACHEABLE[action] else 0)
            body = self.cache.get(key)
            if body is not None:
                self.out.append(b'{"id":%d,"result":%s}\n' % (rid, body))
                return
        try:
            outcome = self._call(action, inp)
        except PluginError as fault:  # the state file could not be read or written
            self.out.append(_dumps({"id": rid, "error": fault.document()}).encode() + b"\n")
            return
        if outcome.error is not None:
            text = _dumps({"id": rid, "error": outcome.error}).encode() + b"\n"
        else:
            body = _dumps(outcome.result).encode()
            text = b'{"id":%d,"result":%s}\n' % (rid, body)
            plain = not (outcome.change or outcome.delay or outcome.disrupt)
            if key is not None and plain:
                if len(self.cache) >= MAX_CACHED:
                    self.cache.clear()
                self.cache[key] = body
        if outcome.disrupt == "hang":
            _log(f"request {rid}: hang fault, never answering")
            return
        if outcome.disrupt == "garbage":
            text = GARBAGE
        elif outcome.disrupt == "crash":
            self.flush()
            self.save_soft()
            _write_all(text[: len(text) // 2])
            _log(f"request {rid}: crash fault, exiting mid-answer")
            os._exit(EXIT_CRASH)
        if outcome.delay:
            heapq.heappush(self.delayed, (time.monotonic() + outcome.delay, rid, text))
        else:
            self.out.append(text)

    def flush(self) -> None:
        if self.out:
            _write_all(b"".join(self.out))
            self.out.clear()

    def release_due(self) -> float | None:
        """Move due delayed answers to the output; return seconds until the next one (None: nothing waits)."""
        now = time.monotonic()
        while self.delayed and self.delayed[0][0] <= now:
            self.out.append(heapq.heappop(self.delayed)[2])
        return max(0.0, self.delayed[0][0] - now) if self.delayed else None

    def serve(self) -> None:
        pending = b""
        while True:
            timeout = self.release_due()
            self.flush()
            ready, _, _ = select.select([0], [], [], timeout)
            if not ready:
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            pending += chunk
            if b"\n" not in pending:
                if len(pending) > MAX_LINE:
                    _log(f"dropping an input line longer than {MAX_LINE} bytes")
                    pending = b""
                continue
            *lines, pending = pending.split(b"\n")
            if self.store.changed_on_disk():
                self.state = self._locked_load()
                self.soft_dirty = False
            for raw in lines:
                if raw.strip():
                    self.line(raw)
            self.save_soft()
        self.flush()
        self.save_soft()


def _terminate(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    env = dict(os.environ)
    try:
        server = Server(config_mod.load(env), Store.from_env(env))
    except PluginError as fault:
        _log(f"cannot start: {fault.code}: {fault.message}")
        return 1
    try:
        server.serve()
    finally:
        server.save_soft()
    return 0
