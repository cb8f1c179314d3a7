"""joined.<cluster>.txt: the machines seen joined, across daemon restarts (issue 31, finding 1)."""

from __future__ import annotations

import os
import stat

import pytest

from provisionerd.controller.joined_file import MAX_REF, JoinedRefs
from provisionerd.domain.errors import StateFileDamaged


def test_refs_added_are_read_back_by_the_next_start_and_the_file_is_private(tmp_path) -> None:
    path = tmp_path / "state" / "joined.c1.txt"
    first = JoinedRefs.load(path)
    assert len(first) == 0
    first.update(["c1:sim:op:0/0", "c1:sim:op:0/1"])
    first.add("c1:sim:op:0/1")  # seen again: not written twice
    first.add("c1:sim:op:1/0")
    assert path.read_text().splitlines() == ["c1:sim:op:0/0", "c1:sim:op:0/1", "c1:sim:op:1/0"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert set(JoinedRefs.load(path)) == {"c1:sim:op:0/0", "c1:sim:op:0/1", "c1:sim:op:1/0"}


def test_prune_keeps_only_the_refs_asked_for_on_disk_too(tmp_path) -> None:
    path = tmp_path / "joined.c1.txt"
    joined = JoinedRefs(path)
    joined.update(f"r{i}" for i in range(5))
    joined.prune({"r1", "r3", "gone"})
    assert set(joined) == {"r1", "r3"} and set(JoinedRefs.load(path)) == {"r1", "r3"}
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic rewrite left no temporary file


def test_lines_that_are_no_ref_are_skipped_and_counted_not_fatal(tmp_path) -> None:
    path = tmp_path / "joined.c1.txt"
    path.write_bytes(b"good/0\n" + b"x" * (MAX_REF + 1) + b"\nbad\x01ref\n\nalso/1\n\xff\xfe\n")
    joined = JoinedRefs.load(path)
    assert set(joined) == {"good/0", "also/1"} and joined.refused == 3


def test_an_unreadable_or_huge_file_is_a_damaged_state_file(tmp_path) -> None:
    directory = tmp_path / "joined.c1.txt"
    directory.mkdir()  # a directory where the file should be: reading it fails
    with pytest.raises(StateFileDamaged, match="joined.c1.txt"):
        JoinedRefs.load(directory)


def test_a_failed_write_is_counted_and_logged_and_the_set_stays_whole(tmp_path, caplog) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    joined = JoinedRefs(blocker / "joined.c1.txt")  # its directory cannot be made: every write fails
    joined.update(["a/0", "b/0"])
    joined.prune({"a/0"})
    assert set(joined) == {"a/0"} and joined.write_failures == 2
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"]
