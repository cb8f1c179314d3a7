"""The reference controller's data directory is 0700 and its store files (``facts.sqlite``, ``-wal``, ``-shm``,
the mark) 0600 whatever the umask: the daemon's own rule (``telemetry.files``), although they hold hashes only."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rigs.controller import serving

from refcontroller.store import FactStore

STORE_FILES = ("facts.sqlite", "facts.sqlite-wal", "facts.sqlite-shm", "facts.sqlite.mark")


@contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def modes(data: Path) -> dict[str, str]:
    found = {name: oct(stat.S_IMODE((data / name).stat().st_mode)) for name in STORE_FILES if (data / name).exists()}
    return {".": oct(stat.S_IMODE(data.stat().st_mode)), **found}


@pytest.mark.process
def test_serve_under_a_permissive_umask_keeps_its_files_private(certs: Path, tmp_path: Path) -> None:
    data = tmp_path / "state" / "data"  # two levels made by the controller
    with umask(0), serving(certs, data, tmp_path / "controller.log"):
        seen = modes(data)
    assert seen == {".": "0o700", **dict.fromkeys(STORE_FILES, "0o600")}
    assert oct(stat.S_IMODE(data.parent.stat().st_mode)) == "0o700"


def test_a_store_opened_under_umask_0_is_created_private(tmp_path: Path) -> None:
    with umask(0):
        store = FactStore.open(tmp_path / "facts.sqlite")
        try:
            seen = modes(tmp_path)
        finally:
            store.close()
    assert {name: mode for name, mode in seen.items() if name != "."} == dict.fromkeys(STORE_FILES, "0o600")


def test_store_files_left_readable_by_an_older_controller_are_narrowed(tmp_path: Path) -> None:
    FactStore.open(tmp_path / "facts.sqlite").close()
    for name in ("facts.sqlite", "facts.sqlite-wal", "facts.sqlite-shm"):
        if (tmp_path / name).exists():
            os.chmod(tmp_path / name, 0o644)
    assert modes(tmp_path)["facts.sqlite"] == "0o644"
    with umask(0):
        FactStore.open(tmp_path / "facts.sqlite").close()
    assert {name: mode for name, mode in modes(tmp_path).items() if name != "."} == {
        name: "0o600" for name in STORE_FILES if (tmp_path / name).exists()
    }
