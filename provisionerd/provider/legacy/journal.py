"""The legacy adapter's journal: which plugin requestIds each of our op_ids became, and what came of them.

A legacy LSF plugin invents its own requestIds and knows nothing of op_ids, so the adapter keeps the mapping. The
journal is what turns "the daemon died in the middle of requestMachines" into a refused retry instead of a second
set of machines: a call is recorded as ``calling`` *before* the plugin runs (written and fsync'd), and only an
answer moves it on. A record still ``calling`` when the journal is loaded again belonged to a process that died
mid-call: its outcome is unknown.

The file (``path``; empty = memory only) is JSON, replaced atomically (``JournalFile``; the simulation keeps it in
its simulated host's memory through the same ``JournalStore`` interface). It is bounded: at most ``max_ops`` create
and ``max_ops`` return operations are kept, the oldest dropped first (a dropped create's requestId then answers as
unknown). Sync I/O on purpose: a few KiB, written only when a mutation starts or ends or a machine is first seen.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, Protocol

import attrs

from provisionerd.domain.errors import ConfigError
from provisionerd.plugin_sdk.atomic import write_private_json

CALLING = "calling"  # the plugin was started; no answer yet
ACCEPTED = "accepted"  # the plugin answered a requestId
REFUSED = "refused"  # the plugin refused: nothing happened
UNKNOWN = "unknown"  # timed out, crashed or garbled: the plugin may or may not have acted
NOT_ISSUED = "not_issued"  # a later per-machine call never started (an earlier one failed, or time ran out)
STATES = (CALLING, ACCEPTED, REFUSED, UNKNOWN, NOT_ISSUED)


@attrs.define
class PluginCall:
    """One plugin ``requestMachines`` for ``refs`` (our instanceRefs, in order)."""

    refs: list[str]
    state: str = NOT_ISSUED
    request_id: str | None = None
    detail: str = ""
    key: str = ""  # the key its plugin call was run with (``provider.calls``): found again after a restart
    started_ms: int = 0  # wall clock when the plugin was started (``legacy.attribution``)
    ended_ms: int = 0  # wall clock by which it had ended, when its outcome is unknown (0: not known)
    #: Its loss was judged while the daemon ran (``_issue`` tried the attribution then, and the op was failed if
    #: it found nothing): never attributed later, when nobody would poll what it found (seed 740275542).
    judged: bool = False


@attrs.define
class SeenMachine:
    """A machine a create request reported: the instanceRef the adapter gave it, its plugin request, its name."""

    ref: str | None
    request_id: str
    name: str


@attrs.define
class CreateOp:
    op_id: str
    template_id: str
    count: int
    calls: list[PluginCall]
    machines: dict[str, SeenMachine] = attrs.field(factory=dict)

    def accepted(self) -> list[PluginCall]:
        return [c for c in self.calls if c.state == ACCEPTED]

    def unassigned_refs(self, call: PluginCall) -> list[str]:
        taken = {m.ref for m in self.machines.values()}
        return [r for r in call.refs if r not in taken]


@attrs.define
class ReturnOp:
    op_id: str
    machines: list[dict[str, str]]
    state: str = CALLING
    request_id: str | None = None
    detail: str = ""


class JournalStore(Protocol):
    """Where the journal's document survives the process: ``read`` gives the last one written (``None``: none yet;
    ``OSError``/``ValueError`` when it cannot be read), ``write`` replaces it durably."""

    @property
    def where(self) -> str: ...

    def read(self) -> Any: ...

    def write(self, document: dict[str, Any]) -> None: ...


@attrs.frozen
class JournalFile:
    """The journal's file: JSON, replaced atomically and fsync'd (a ``calling`` record must survive the crash it
    exists for)."""

    where: str

    def read(self) -> Any:
        if not os.path.exists(self.where):
            return None
        with open(self.where, encoding="utf-8") as f:
            return json.load(f)

    def write(self, document: dict[str, Any]) -> None:
        write_private_json(self.where, document)


class Journal:
    """In memory, mirrored to its store after each ``save`` (``path``: a ``JournalFile``; neither: memory only).
    ``creates``/``returns`` are keyed by op_id, oldest first."""

    def __init__(self, path: str = "", max_ops: int = 4096, *, store: JournalStore | None = None) -> None:
        self.store: JournalStore | None = store if store is not None else JournalFile(path) if path else None
        self.path = self.store.where if self.store is not None else ""
        self.max_ops = max_ops
        self.creates: dict[str, CreateOp] = {}
        self.returns: dict[str, ReturnOp] = {}
        if self.store is not None:
            self._load(self.store)

    def machine_index(self) -> dict[str, tuple[CreateOp, SeenMachine]]:
        """Every machine a create request reported, by machine id."""
        return {mid: (op, seen) for op in self.creates.values() for mid, seen in op.machines.items()}

    def returned_ids(self) -> set[str]:
        return {m["machineId"] for op in self.returns.values() if op.state == ACCEPTED for m in op.machines}

    def unknown_creates(self) -> Iterator[CreateOp]:
        """Create ops with a call whose outcome is unknown."""
        return (op for op in self.creates.values() if any(c.state in (UNKNOWN, CALLING) for c in op.calls))

    def save(self) -> None:
        for table in (self.creates, self.returns):
            while len(table) > self.max_ops:
                del table[next(iter(table))]
        if self.store is None:
            return
        document = {
            "version": 1,
            "creates": [attrs.asdict(op) for op in self.creates.values()],
            "returns": [attrs.asdict(op) for op in self.returns.values()],
        }
        self.store.write(document)

    def _load(self, store: JournalStore) -> None:
        try:
            document = store.read()
            if document is None:
                return
            for raw in document["creates"]:
                op = CreateOp(
                    op_id=raw["op_id"],
                    template_id=raw["template_id"],
                    count=int(raw["count"]),
                    calls=[PluginCall(**c) for c in raw["calls"]],
                    machines={k: SeenMachine(**v) for k, v in raw["machines"].items()},
                )
                for call in op.calls:
                    if call.state not in STATES:
                        raise ValueError(f"unknown call state {call.state!r}")
                    if call.state == CALLING:
                        # Whoever was calling died before the answer: that is an unknown outcome now.
                        call.state, call.detail = UNKNOWN, "the daemon stopped during the call"
                self.creates[op.op_id] = op
            for raw in document["returns"]:
                rop = ReturnOp(**raw)
                if rop.state == CALLING:
                    rop.state, rop.detail = UNKNOWN, "the daemon stopped during the call"
                self.returns[rop.op_id] = rop
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"legacy journal {self.path!r} is unreadable", [f"{type(exc).__name__}: {exc}"]) from None

    def describe(self) -> dict[str, Any]:
        """Counts for status output."""
        return {
            "creates": len(self.creates),
            "returns": len(self.returns),
            "unknown_outcomes": sum(1 for _ in self.unknown_creates()),
        }
