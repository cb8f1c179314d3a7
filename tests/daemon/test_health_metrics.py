"""The machine-health gauges (issue 20 item 2) read the status document's ``health.machines`` of each provider."""

from __future__ import annotations

from provisionerd.telemetry.metrics_snapshot import SnapshotCollector


def gauges(doc: dict) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("provider", "")): sample.value
        for family in SnapshotCollector(lambda: doc).collect()
        for sample in family.samples
        if sample.name in ("provisionerd_provider_protected", "provisionerd_unhealthy_machines")
    }


def test_a_protected_provider_reads_1_with_its_unhealthy_count_and_others_read_0() -> None:
    protected = {"unhealthy": 3, "max_unhealthy": 1, "protected": True, "reason": "...", "eases_in_s": 590.0}
    doc = {
        "providers": {
            "ec2": {"health": {"state": "healthy", "machines": protected}, "lease": {"state": "held"}},
            "slurm": {"health": {"state": "healthy"}, "lease": {"state": "held"}},
        }
    }
    assert gauges(doc) == {
        ("provisionerd_provider_protected", "ec2"): 1.0,
        ("provisionerd_unhealthy_machines", "ec2"): 3.0,
        ("provisionerd_provider_protected", "slurm"): 0.0,
        ("provisionerd_unhealthy_machines", "slurm"): 0.0,
    }


def test_status_text_says_why_replacement_stopped() -> None:
    from provisionerd.cli.status import render_provider

    reason = (
        "provider 'ec2' protected: 3 unhealthy machines within 600s, more than max_unhealthy 1: replacement stopped"
    )
    machines = {"unhealthy": 3, "max_unhealthy": 1, "window_s": 600.0, "protected": True, "reason": reason}
    lines = render_provider("ec2", {"health": {"state": "healthy", "machines": {**machines, "eases_in_s": 590.0}}})
    assert f"  PROTECTED: {reason}  (eases in 590.0s)" in lines
    calm = {**machines, "protected": False, "reason": None, "unhealthy": 1}
    assert "  unhealthy machines: 1 within 600.0s (max_unhealthy 1)" in render_provider(
        "ec2", {"health": {"machines": calm}}
    )
