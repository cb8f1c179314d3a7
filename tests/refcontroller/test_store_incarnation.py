"""A store's incarnation and its mark: the controller refuses a store that forgot what it acknowledged.

In process for every rule (``FactStore.open``), and as real processes for what an operator sees: ``refcontroller
serve`` on a zero-length store, on a store whose write-ahead log was lost after a ``kill -9``, and on a damaged
store exits 2 with one line on stderr; ``--new-incarnation`` starts afresh and sets the old files aside.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from rigs import controller, procs

from provisionerd.domain.model import Epoch, Lost
from refcontroller.store import FactStore, StoreRefused, mark_path, read_mark


def fact(n: int) -> Lost:
    return Lost("p", Epoch(1, 1), f"op-{n}", f"m-{n}", "gone")


def written(path: Path, facts: int = 2) -> str:
    store = FactStore.open(path)
    store.save_term(store.load_term() + 1)
    for n in range(facts):
        store.append(fact(n), "d1")
    incarnation = store.incarnation
    store.close()
    return incarnation


def test_the_incarnation_is_made_once_and_kept_across_reopens(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    first = written(path)
    assert len(first) == 32
    again = FactStore.open(path)
    assert again.incarnation == first and again.last_index() == 2
    mark = read_mark(mark_path(path))
    assert mark is not None and (mark.incarnation, mark.term, mark.last_index) == (first, 1, 2)
    assert os.stat(mark_path(path)).st_mode & 0o777 == 0o600
    again.close()
    one, two = FactStore.open(":memory:"), FactStore.open(":memory:")
    assert one.incarnation != two.incarnation
    one.close()
    two.close()


def test_a_zero_length_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    written(path)
    path.write_bytes(b"")
    with pytest.raises(StoreRefused, match="zero-length file but its mark says incarnation"):
        FactStore.open(path)
    mark_path(path).unlink()  # even without the mark: we never made a zero-length store
    with pytest.raises(StoreRefused, match="zero-length file .not a store this controller made"):
        FactStore.open(path)


def test_a_mark_without_its_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    written(path)
    path.unlink()
    with pytest.raises(StoreRefused, match="is missing but its mark says"):
        FactStore.open(path)


def test_a_store_behind_its_mark_is_refused(tmp_path: Path) -> None:
    """An older copy of the file (what a lost WAL or a restored backup leaves) is behind the mark."""
    path = tmp_path / "facts.sqlite"
    written(path, facts=1)
    old = path.read_bytes()
    store = FactStore.open(path)
    store.append(fact(7), "d1")
    store.close()
    path.write_bytes(old)
    with pytest.raises(StoreRefused, match="behind its mark: it holds change .* last index 1, the mark says .*"):
        FactStore.open(path)


def test_a_header_only_file_with_a_mark_is_refused(tmp_path: Path) -> None:
    """The first start's WAL lost: the main file is SQLite's bare header page (no tables), the mark names a log."""
    path = tmp_path / "facts.sqlite"
    written(path)
    path.unlink()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    with pytest.raises(StoreRefused, match="holds no incarnation but its mark says"):
        FactStore.open(path)


def test_another_incarnation_or_a_lost_mark_is_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "one.sqlite", tmp_path / "two.sqlite"
    written(one)
    written(two)
    os.replace(two, one)  # another store's file under this mark
    with pytest.raises(StoreRefused, match="is incarnation .* but its mark says"):
        FactStore.open(one)
    mark_path(one).unlink()
    with pytest.raises(StoreRefused, match="has lost its mark"):
        FactStore.open(one)


def test_a_damaged_store_or_mark_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    written(path)
    mark = mark_path(path).read_text()
    mark_path(path).write_text("{not json")
    with pytest.raises(StoreRefused, match="mark .* is damaged"):
        FactStore.open(path)
    mark_path(path).write_text(mark)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"garbage" * 500)
    with pytest.raises(StoreRefused, match="is damaged: "):
        FactStore.open(path)


def test_new_incarnation_sets_the_old_files_aside(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    old = written(path)
    path.write_bytes(b"")
    fresh = FactStore.open(path, new_incarnation=True)
    assert fresh.incarnation != old and fresh.last_index() == 0 and fresh.load_term() == 0
    fresh.close()
    aside = sorted(p.name.split(".discarded-")[0] for p in tmp_path.iterdir() if ".discarded-" in p.name)
    assert aside == ["facts.sqlite", "facts.sqlite.mark"]
    reopened = FactStore.open(path)
    assert reopened.incarnation == fresh.incarnation
    reopened.close()


def test_a_store_from_before_incarnations_gets_one_once(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    written(path)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM meta WHERE key IN ('incarnation', 'changes')")
    conn.commit()
    conn.close()
    mark_path(path).unlink()
    upgraded = FactStore.open(path)
    assert len(upgraded.incarnation) == 32 and upgraded.last_index() == 2
    upgraded.close()
    reopened = FactStore.open(path)
    assert reopened.incarnation == upgraded.incarnation
    reopened.close()


# --- real processes ----------------------------------------------------------------------------------------------


def refused(certs: Path, data: Path) -> subprocess.CompletedProcess[str]:
    done = procs.run(controller.serve_argv(certs, data), timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refcontroller: store "), done.stderr
    assert "Traceback" not in done.stderr
    return done


def demand(certs: Path, address: str) -> None:
    items = '[{"demand_id": "d", "shape": {"ncpus": 1}, "count": 2}]'
    argv = procs.refcontroller("admin", "--certs", certs, "--connect", address, "demand", "--file", "-")
    done = procs.run(argv, input=items, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.process
def test_serve_refuses_a_store_whose_wal_was_lost_with_a_kill_9(certs: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with controller.serving(certs, data, tmp_path / "serve.log") as served:
        demand(certs, served.address)  # a write the controller acknowledged
        os.kill(served.process.pid, signal.SIGKILL)
        served.process.wait(timeout=30)
    ready = served.ready
    assert (data / "facts.sqlite-wal").exists()
    (data / "facts.sqlite-wal").unlink()
    (data / "facts.sqlite-shm").unlink(missing_ok=True)
    done = refused(certs, data)
    assert "its mark says incarnation " + ready["incarnation"] in done.stderr
    assert "write-ahead log was lost" in done.stderr


@pytest.mark.process
def test_serve_refuses_zero_length_and_damaged_stores_then_starts_afresh_when_told(certs: Path, tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    with controller.serving(certs, data, log) as served:
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) == 0
    first = served.ready
    store = data / "facts.sqlite"
    intact = store.read_bytes()
    store.write_bytes(b"")
    assert "zero-length file" in refused(certs, data).stderr
    store.write_bytes(intact[:100] + b"garbage" * 600 + intact[100 + 7 * 600 :])
    assert "is damaged" in refused(certs, data).stderr
    with controller.serving(certs, data, log, "--new-incarnation") as served:
        fresh = served.ready
        assert fresh["incarnation"] != first["incarnation"] and fresh["term"] == 1
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=30)
    assert any(p.name.startswith("facts.sqlite.discarded-") for p in data.iterdir())
