"""Where the legacy adapter reads a plugin's own record of its requests (``[providers.legacy] state_file``).

``PluginState`` is read in two ways: ``read`` on the spot (at start-up and when a call left by an earlier process is
collected: a few KiB, bounded by ``state_files.MAX_BYTES``), ``aread`` off the event loop (after a call's outcome
became unknown while the daemon runs). ``StateFile`` is the plugin's file in its ``data_dir`` through one of
``state_files.READERS``; the simulation gives the adapter its simulated plugin's record instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from provisionerd.provider.legacy.state_files import READERS, StateRead


class PluginState(Protocol):
    def read(self) -> StateRead: ...

    async def aread(self) -> StateRead: ...


@attrs.frozen
class StateFile:
    reader: Callable[[str], StateRead]
    data_dir: str

    def read(self) -> StateRead:
        return self.reader(self.data_dir)

    async def aread(self) -> StateRead:
        return await trio.to_thread.run_sync(self.reader, self.data_dir)


def state_file(layout: str, data_dir: str) -> StateFile | None:
    """The state file of a plugin whose layout is ``layout`` (a name in ``READERS``), or ``None`` (none known)."""
    reader = READERS.get(layout)
    return None if reader is None else StateFile(reader, data_dir)
