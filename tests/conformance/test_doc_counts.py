"""docs/controllers.md states the kit's row counts as the battery makes them (``conformance.doc_counts``)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from provisionerd.conformance.battery import CHECKS
from provisionerd.conformance.doc_counts import END, START, documented, quick_start

DOC = Path(__file__).resolve().parents[2] / "docs" / "controllers.md"


def test_the_quick_start_counts_are_the_batterys() -> None:
    assert documented(DOC.read_text()) == quick_start(), (
        "docs/controllers.md's kit counts differ from the battery: paste the output of"
        " `python -m provisionerd.conformance.doc_counts`"
    )


def test_the_block_follows_the_rows_flags() -> None:
    total, admin = len(CHECKS), sum(c.admin for c in CHECKS)
    assert f"# {total} rows: {total - admin} run, {admin} NOT RUN" in quick_start()
    fewer = [c for c in CHECKS if c.name != "failover: grace after promotion"]
    assert f"# {total - 1} rows: {total - admin} run, {admin - 1} NOT RUN" in quick_start(fewer)
    two_standby = [attrs.evolve(c, standby=c.standby or c.name == "join accepted, version negotiated") for c in CHECKS]
    assert f"{admin + 2} NOT RUN with one address" in quick_start(two_standby)


def test_a_doc_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="kit-counts"):
        documented("no block here")
    assert documented(f"a\n{START}\nx\n{END}\nb") == "x"
