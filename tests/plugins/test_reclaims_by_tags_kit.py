"""The conformance kit's ``getReturnRequests`` row for ``features.reclaimsByTags`` (``provisionerd provider
check``): the simulated provider, which declares it, is asked by the cluster's tag too and passes; a plugin that
declares it yet wants back a machine the tag does not list fails the row, naming the machine; a plugin that does not
declare it is asked only by name."""

from __future__ import annotations

import pytest
from plugintest_client import SIMULATED
from test_all_or_nothing_kit import kit, mini

from provisionerd.provider.kit import RECLAIMS_ROW

pytestmark = pytest.mark.process


def test_the_simulated_provider_is_asked_by_tag_and_passes() -> None:
    rows = kit(SIMULATED)
    ok, detail = rows[RECLAIMS_ROW]
    assert ok and detail == "0 machines wanted back; by the cluster's tag (reclaimsByTags): 0", detail


def test_a_plugin_that_wants_back_a_machine_without_the_tag_fails_the_row(tmp_path) -> None:
    rows = kit(mini(tmp_path / "foreign", ["reclaim_foreign"]))
    ok, detail = rows[RECLAIMS_ROW]
    assert not ok
    assert "reclaimsByTags: wanted back by the cluster's tag but not listed under it: ['m-elsewhere']" in detail
    assert [name for name, (ok, _) in rows.items() if not ok] == [RECLAIMS_ROW]
    plain = kit(mini(tmp_path / "plain", []))
    assert plain[RECLAIMS_ROW] == (True, "0 machines wanted back")
