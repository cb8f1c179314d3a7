"""The daemon's state file: what it remembers of one cluster's controller (``amnesia.ControllerMemory``), on disk.

Where: ``<state_dir>/controller.<cluster>.json``, with ``state_dir`` from ``[daemon] state_dir``, else the
directory of ``[daemon] events_log``; with neither the memory lives in the process only (amnesia is then detected
within one start of the daemon, not across a restart; the daemon says so at start). One daemon owns a state file
at a time: ``provisionerd orphans adopt|return`` with no daemon running reads and updates the same one.

The document, one JSON object::

    {"version": 1, "cluster": "hpc", "incarnation": "9f0c...", "last_index": 6, "epochs": {"aws": "3.2"}}

Written atomically (a private temporary file of mode 0600 in the same directory, fsync, rename, fsync of the
directory) every time a value grows; the directory is created with mode 0700. A file that cannot be read, is not
such a document, or names another cluster is ``StateFileDamaged`` (with its path): never silently reset, because
an empty memory accepts any controller.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

from provisionerd.config.loader import Config
from provisionerd.controller.amnesia import ControllerMemory
from provisionerd.controller.joined_file import JoinedRefs
from provisionerd.domain.errors import StateFileDamaged
from provisionerd.domain.model import Epoch
from provisionerd.telemetry.files import write_atomic

log = logging.getLogger(__name__)

VERSION = 1
MAX_STATE = 1 << 20  # bytes: far above a thousand providers' epochs


class MemoryStore(Protocol):
    """Where the memory is kept: ``load`` once at start, ``save`` after every change."""

    @property
    def where(self) -> str:
        """The path, or a sentence for a store that has none (status and logs show it)."""

    def load(self) -> ControllerMemory: ...

    def save(self, memory: ControllerMemory) -> None: ...


class InMemory:
    """No file: the memory lasts as long as the process (tests, the simulation, a config with no directory)."""

    where = "in memory only (no [daemon] state_dir or events_log)"

    def __init__(self, memory: ControllerMemory | None = None) -> None:
        self.memory = memory or ControllerMemory()

    def load(self) -> ControllerMemory:
        return self.memory

    def save(self, memory: ControllerMemory) -> None:
        self.memory = memory


class StateFile:
    def __init__(self, path: Path, cluster: str) -> None:
        self.path = path
        self.cluster = cluster

    @property
    def where(self) -> str:
        return str(self.path)

    def load(self) -> ControllerMemory:
        """The memory in the file, or the empty memory if there is no file. Raises ``StateFileDamaged``."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_STATE + 1)
        except FileNotFoundError:
            return ControllerMemory()
        except OSError as exc:
            raise StateFileDamaged(str(self.path), f"cannot read it: {exc.strerror or exc}") from None
        try:
            if len(raw) > MAX_STATE:
                raise ValueError(f"larger than {MAX_STATE} bytes")
            return self._parse(json.loads(raw))
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise StateFileDamaged(str(self.path), str(exc) or type(exc).__name__) from None

    def _parse(self, doc: object) -> ControllerMemory:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, this daemon reads {VERSION}")
        if doc.get("cluster") != self.cluster:
            raise ValueError(f"it is for cluster {doc.get('cluster')!r}, not {self.cluster!r}")
        incarnation, last_index, epochs = doc["incarnation"], doc["last_index"], doc["epochs"]
        if not isinstance(incarnation, str) or len(incarnation) > 256:
            raise ValueError("incarnation must be a string of at most 256 characters")
        if type(last_index) is not int or last_index < 0:
            raise ValueError("last_index must be a non-negative integer")
        if not isinstance(epochs, dict) or not all(isinstance(v, str) for v in epochs.values()):
            raise ValueError("epochs must map provider names to '<term>.<seq>'")
        return ControllerMemory(
            incarnation=incarnation,
            last_index=last_index,
            epochs={str(p): Epoch.parse(v) for p, v in epochs.items()},
        )

    def save(self, memory: ControllerMemory) -> None:
        """Replace the file atomically with ``memory`` (see the module docstring). Raises ``OSError``."""
        doc = {
            "version": VERSION,
            "cluster": self.cluster,
            "incarnation": memory.incarnation,
            "last_index": memory.last_index,
            "epochs": {p: str(e) for p, e in sorted(memory.epochs.items())},
        }
        write_atomic(self.path, (json.dumps(doc, sort_keys=True) + "\n").encode())


def state_dir_of(config: Config) -> Path | None:
    """``[daemon] state_dir``, else the events log's directory, else ``None`` (memory only)."""
    daemon = config.daemon
    if daemon.state_dir is not None:
        return daemon.state_dir
    return None if daemon.events_log is None else daemon.events_log.parent


def joined_refs(config: Config) -> JoinedRefs:
    """The machines seen joined (``joined_file``): ``<state_dir>/joined.<cluster>.txt`` when there is a state
    directory, else in memory only. Raises ``StateFileDamaged`` for a file that cannot be read."""
    directory = state_dir_of(config)
    if directory is None:
        return JoinedRefs()
    joined = JoinedRefs.load(directory / f"joined.{config.cluster}.txt")
    if joined.refused:
        log.warning("%s: %d line(s) that are no instance ref skipped", joined.path, joined.refused)
    return joined


def memory_store(config: Config) -> MemoryStore:
    """The state file of ``config``'s cluster (see the module docstring), or ``InMemory`` when there is no place."""
    directory = state_dir_of(config)
    if directory is None:
        return InMemory()
    return StateFile(directory / f"controller.{config.cluster}.json", config.cluster)
