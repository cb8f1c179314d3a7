"""The state file ``$PRO_DATA_DIR/state.json``: shared by one-shot calls and the persistent process.

Writers hold an exclusive ``fcntl.flock`` on ``state.lock`` for the whole read-modify-write, and replace the file
atomically (``plugin_sdk.atomic``: a 0600 temp file, rename), so a reader never sees half a document and two
processes never lose each other's machines. ``durable`` saves also fsync the file and the directory: a created
machine must survive a crash of the plugin right after it answered.
"""

from __future__ import annotations

import fcntl
import json
import os

from provisionerd.plugin_sdk.atomic import write_private_json
from provisionerd.plugin_sdk.errors import PluginError


class Store:
    def __init__(self, data_dir: str) -> None:
        self.dir = data_dir
        self.path = os.path.join(data_dir, "state.json")
        self._lock_path = os.path.join(data_dir, "state.lock")
        self._lock_fd: int | None = None
        self._seen: tuple | None = None  # (inode, mtime_ns, size) of the file as last read or written

    @classmethod
    def from_env(cls, env: dict) -> Store:
        data_dir = env.get("PRO_DATA_DIR")
        if not data_dir:
            raise PluginError(
                "provider_error", "PRO_DATA_DIR is not set: the simulated provider needs a state directory"
            )
        try:
            os.makedirs(data_dir, exist_ok=True)
        except OSError as e:
            raise PluginError("provider_error", f"cannot create PRO_DATA_DIR {data_dir}: {e.strerror}") from None
        return cls(data_dir)

    def lock(self) -> None:
        if self._lock_fd is None:
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _signature(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def changed_on_disk(self) -> bool:
        """Whether another process replaced the file since this one last read or wrote it (one ``stat``)."""
        return self._signature() != self._seen

    def load(self, empty) -> dict:
        """Read the state (``empty()`` when there is none yet). A corrupt file is a ``provider_error``."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
                st = os.fstat(f.fileno())
                self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            self._seen = None
            return empty()
        try:
            state = json.loads(raw)
        except ValueError:
            raise PluginError(
                "provider_error", f"{self.path} is corrupt (not JSON); move it aside to start afresh"
            ) from None
        if not isinstance(state, dict) or state.get("version") != 1:
            raise PluginError("provider_error", f"{self.path} has an unknown layout; move it aside to start afresh")
        return state

    def save(self, state: dict, durable: bool) -> None:
        write_private_json(self.path, state, durable=durable)
        self._seen = self._signature()
