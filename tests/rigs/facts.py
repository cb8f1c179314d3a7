"""A reference controller's fact log as a test reads it: live from the store of a controller in the test's own
process (``open_refcontroller``: ``ctl.server.cluster.store``), or from its file once the run is over."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def facts_of(store: Any, kind: type[T]) -> list[T]:
    """The facts of ``kind`` in ``store``, in log order."""
    return [c.fact for c in store.all_facts() if isinstance(c.fact, kind)]


def stored_facts(path: Path) -> list[Any]:
    """Every fact in the controller's store file ``path`` (``<data>/facts.sqlite``), in log order."""
    from refcontroller.store import FactStore

    store = FactStore.open(path)
    try:
        return [c.fact for c in store.all_facts()]
    finally:
        store.close()
