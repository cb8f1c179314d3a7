"""Repeated log lines are written once and counted (``telemetry.log_collapse``)."""

from __future__ import annotations

import io
import logging

from provisionerd.telemetry import log_collapse
from provisionerd.telemetry.log_collapse import collapsed_logs


def test_repeats_are_collapsed_with_a_count_in_first_seen_order() -> None:
    out = io.StringIO()
    log = logging.getLogger("provisionerd.test.collapse")
    with collapsed_logs(out):
        for _ in range(586):
            log.warning("listMachines: answer refused at %s", "$.machines[0].status")
        log.warning("describeProvider: answer refused")
        log.warning("describeProvider: answer refused")
        log.info("below the level: not written")
    assert out.getvalue().splitlines() == [
        "listMachines: answer refused at $.machines[0].status",
        "describeProvider: answer refused",
        "listMachines: answer refused at $.machines[0].status (repeated 585 more times)",
        "describeProvider: answer refused (repeated 1 more times)",
    ]
    assert not any(isinstance(h, log_collapse.CollapsingHandler) for h in logging.getLogger().handlers)


def test_distinct_lines_past_the_cap_are_written_uncounted(monkeypatch) -> None:
    monkeypatch.setattr(log_collapse, "MAX_DISTINCT", 2)
    out = io.StringIO()
    log = logging.getLogger("provisionerd.test.collapse")
    with collapsed_logs(out) as handler:
        for text in ("a", "b", "c", "c"):
            log.warning(text)
        assert len(handler.counts) == 2
    assert out.getvalue().splitlines() == ["a", "b", "c", "c"]
