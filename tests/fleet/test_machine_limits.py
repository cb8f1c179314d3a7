"""Item 8 of issue 20 on the daemon's side: ``worker_orphan_timeout`` and ``max_ttl`` reach each new machine's
bootstrap (``orphanTimeout``, ``maxLifetime``), only when set, and the contract's schema accepts them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs.daemon import parsed_config

from provisionerd.config.loader import DEFAULT_WORKER_ORPHAN_TIMEOUT
from provisionerd.daemon.builder import executor_settings_from, policy_from_config
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import Epoch
from provisionerd.domain.tokens import issue
from provisionerd.provider.contract import request_input
from provisionerd.provider.schemas import contract
from provisionerd.provider.values import MachineLimits, MachineRequest, OwnerTags

PROVIDERS = """
    [[providers]]
    name = "ec2"
    transport = "oneshot"
    path = "plugins/ec2"
    max_ttl = 3600
    worker_orphan_timeout = 600
    disruption_budget = 2
    disruption_budget_percent = 10
    disruption_interval = 120
    [[providers]]
    name = "onprem"
    transport = "oneshot"
    path = "plugins/onprem"
"""


def test_each_provider_tells_its_machines_its_own_limits(tmp_path: Path) -> None:
    config = parsed_config(tmp_path, PROVIDERS)
    settings = executor_settings_from(config, policy_from_config(config))
    assert settings.limits_of("ec2") == MachineLimits(orphan_timeout=600.0, max_lifetime=3600.0)
    # Issue 34: machines end themselves by default (an hour without a controller), unless a site sets 0.
    assert settings.limits_of("onprem") == MachineLimits(orphan_timeout=DEFAULT_WORKER_ORPHAN_TIMEOUT)
    assert settings.limits_of("unknown") == MachineLimits()
    opted_out = parsed_config(tmp_path, PROVIDERS + "worker_orphan_timeout = 0\n")
    off = executor_settings_from(opted_out, policy_from_config(opted_out)).limits_of("onprem")
    assert off == MachineLimits()
    owner = OwnerTags("clu", "ec2", "op-1", Epoch(1, 1))
    limited = request_input(
        MachineRequest.of(owner, "t", issue(["r0", "r1"]), ["ctl0:7400"], settings.limits_of("ec2"))
    )
    plain = request_input(MachineRequest.of(owner, "t", issue(["r0"]), ["ctl0:7400"], off))
    assert [(b["orphanTimeout"], b["maxLifetime"]) for b in limited["bootstrap"]] == [(600.0, 3600.0)] * 2
    assert set(plain["bootstrap"][0]) == {"instanceRef", "controllers", "joinToken"}  # older plugins see no change
    schemas = contract()
    assert schemas.input_problems("requestMachines", limited) == []
    limited["bootstrap"][0]["orphanTimeout"] = 0
    assert schemas.input_problems("requestMachines", limited) != []


def test_the_disruption_budget_reaches_the_planner_policy(tmp_path: Path) -> None:
    config = parsed_config(tmp_path, PROVIDERS)
    ec2, onprem = policy_from_config(config).of("ec2"), policy_from_config(config).of("onprem")
    assert (ec2.disruption_budget, ec2.disruption_budget_percent, ec2.disruption_interval) == (2, 10.0, 120.0)
    assert (onprem.disruption_budget, onprem.disruption_budget_percent) == (None, None)
    bad = PROVIDERS.replace("disruption_budget_percent = 10", "disruption_budget_percent = 150")
    with pytest.raises(ConfigError) as caught:
        parsed_config(tmp_path, bad)
    assert "disruption_budget_percent" in str(caught.value.problems)
