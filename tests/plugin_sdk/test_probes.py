"""``plugin_sdk.probes``: the one check every plugin applies to a template's capability probes (the agent's limits)."""

from __future__ import annotations

import pytest

from provisionerd.agent import capabilities
from provisionerd.plugin_sdk.probes import BUILT_IN, MAX_PROBES, probe_problem


def test_the_limits_are_the_agents() -> None:
    assert MAX_PROBES == capabilities.MAX_PROBES and BUILT_IN == capabilities.BUILT_IN


@pytest.mark.parametrize(
    ("probes", "interval", "problem"),
    [
        ({f"p{i}": "true" for i in range(MAX_PROBES + 1)}, None, f"probes: at most {MAX_PROBES}, not 5"),
        ({"ncpus": "nproc"}, None, "probes.ncpus: the agent reports 'ncpus' itself"),
        ({"gputype": "  "}, None, "probes.gputype: the command is blank"),
        ({"gputype": "a\nb"}, None, "probes.gputype: the command must be one line"),
        ({"gputype": "x" * 1025}, None, "probes.gputype: the command is longer than 1024 characters"),
        ({}, 5, "reprobeInterval: expected 0 (never) or 10 to 86400 seconds, got 5"),
        ({}, 86401, "reprobeInterval: expected 0 (never) or 10 to 86400 seconds, got 86401"),
    ],
)
def test_a_bad_probe_config_is_named(probes: dict[str, str], interval: float | None, problem: str) -> None:
    found = probe_problem(probes, interval)
    assert found is not None and found.startswith(problem)


def test_good_probes_pass_and_ngpus_may_be_replaced() -> None:
    probes = {"ngpus": "rocm-smi --showcount | tail -1", "gputype": "nvidia-smi -L | head -1"}
    assert probe_problem(probes, 0) is None
    assert probe_problem(probes, 300) is None
    assert probe_problem({}, None) is None
