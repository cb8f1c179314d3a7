"""One builder (``provisionerd.daemon.builder``), the daemon's settings: ``DaemonCore`` and the direct path of
``provisionerd orphans adopt|return`` build their pieces from one config the same way, so they cannot drift."""

from __future__ import annotations

import random
from typing import Any

import attrs
import trio
from rigs.memory import memory_config

from provisionerd.config.loader import Backoff, Config, ProviderConfig
from provisionerd.daemon.builder import build_pieces, executor_settings_from, policy_from_config
from provisionerd.daemon.orphan_admin import side_identity
from provisionerd.daemon.root import DaemonCore
from provisionerd.execution.executor import ExecutorSettings
from provisionerd.provider.client import PluginClient
from provisionerd.telemetry.events import EventLog
from provisionerd.testing.fake_provider import FakeProvider


def two_providers(tmp_path) -> Config:
    def provider(name: str, **options: Any) -> ProviderConfig:
        return ProviderConfig(name, "oneshot", path=tmp_path / "plugins" / name, **options)

    return memory_config(
        tmp_path,
        ("ctl0:7400", "ctl1:7400"),
        provider("a", provisioning_timeout=300),
        provider("b", provisioning_timeout=450, join_deadline=120),
        link={"request_timeout": 7, "backoff": Backoff(initial=0.3, max=5, multiplier=3, jitter=0.25)},
    )


async def unreachable(address: str) -> trio.abc.Stream:
    raise OSError(f"nothing runs in this test: {address}")


def test_the_daemon_and_the_direct_path_take_the_same_settings_from_one_config(tmp_path):
    config = two_providers(tmp_path)
    core = DaemonCore(
        config, connect=unreachable, events=EventLog(), providers={n: PluginClient(FakeProvider(n)) for n in "ab"}
    )
    identity = side_identity(config.identity, "admin")
    direct = build_pieces(
        config,
        connect=unreachable,
        events=EventLog(),
        rng=random.Random(),
        providers={"b": PluginClient(FakeProvider("b"))},
        serve=("b",),
        identity=identity,
    )
    # The executor's settings and the policy: derived from the whole config, for both.
    assert (
        direct.executor.settings == core.executor.settings == executor_settings_from(config, policy_from_config(config))
    )
    assert core.executor.settings.return_timeout == core.executor.settings.provisioning_timeout == 450.0
    assert core.executor.settings.provider_timeouts == {"a": 300.0, "b": 450.0}  # each provider polled for its own
    assert core.executor.settings != ExecutorSettings(config.cluster, config.controller.addresses)  # not the defaults
    assert direct.policy == core.policy == policy_from_config(config)
    # The session: the same controller settings, only who joins and for which providers differ.
    assert direct.session.settings == attrs.evolve(core.session.settings, identity=identity, providers=("b",))
    assert core.session.settings.providers == ("a", "b") and core.session.settings.identity == "prov-1"
    assert (direct.identity, core.pieces.identity) == (identity, "prov-1")
    # The keepers (one per served provider) and what they read: the guard judges and remembers every grant, the
    # session's pulses renew every lease after a rejoin and wake a keeper whose provider's lease was freed.
    assert set(direct.keepers) == {"b"} and set(core.keepers) == {"a", "b"}
    for pieces in (direct, core.pieces):
        for name, keeper in pieces.keepers.items():
            assert keeper.judge is pieces.guard and keeper.rejoined is pieces.session.rejoined
            assert keeper.freed is pieces.session.lease_freed[name]
    assert direct.session.guard is direct.guard and core.session.guard is core.pieces.guard


def test_the_daemon_takes_injected_settings_over_the_configs(tmp_path):
    """Tests and the simulation inject a policy and executor settings; the builder uses them as given."""
    config = two_providers(tmp_path)
    configured = policy_from_config(config)
    providers = {n: attrs.evolve(p, provisioning_timeout=60.0) for n, p in configured.providers.items()}
    policy = attrs.evolve(configured, providers=providers)
    settings = ExecutorSettings("clu", ("ctl0:7400",), poll_initial=0.5)
    core = DaemonCore(
        config,
        connect=unreachable,
        events=EventLog(),
        providers={n: PluginClient(FakeProvider(n)) for n in "ab"},
        policy=policy,
        executor_settings=settings,
    )
    assert core.policy is policy and core.executor.settings is settings
    policy_only = DaemonCore(config, connect=unreachable, events=EventLog(), providers={}, policy=policy)
    assert policy_only.executor.settings == executor_settings_from(config, policy)
    assert policy_only.executor.settings.return_timeout == 60.0
    assert policy_only.executor.settings.provider_timeouts == {"a": 60.0, "b": 60.0}


def test_each_provider_keeps_its_own_limits_and_the_orphan_cycle_reads_the_planners(tmp_path):
    """The issue's two providers: spot (join deadline 120 s, max_ttl 3600 s) and onprem (1800 s, no max_ttl). Merged,
    both had 1800 and 3600; now each has its own, and each orphan cycle classifies with its provider's deadline as
    the planner has it (also when a test injects the policy)."""
    spot = ProviderConfig(
        "spot",
        "oneshot",
        path=tmp_path / "plugins" / "spot",
        join_deadline=120,
        max_ttl=3600,
        idle_time=0,
        max_machines=7,
        step_limit=3,
        provisioning_timeout=300,
        capacity_backoff=20,
        unhealthy_backoff=5,
        unhealthy_backoff_max=50,
        quota_pause=600,
    )
    onprem = ProviderConfig("onprem", "oneshot", path=tmp_path / "plugins" / "onprem", join_deadline=1800, max_ttl=0)
    config = memory_config(tmp_path, ("ctl0:7400",), spot, onprem)
    policy = policy_from_config(config)
    spot, onprem = policy.of("spot"), policy.of("onprem")
    assert (spot.join_deadline, spot.max_ttl, onprem.join_deadline, onprem.max_ttl) == (120.0, 3600.0, 1800.0, None)
    assert (spot.idle_time, spot.max_machines, spot.step_limit, spot.provisioning_timeout) == (0.001, 7, 3, 300.0)
    assert (spot.capacity_backoff, spot.unhealthy_base, spot.unhealthy_max, spot.quota_pause) == (20, 5, 50, 600)
    assert (onprem.idle_time, onprem.max_machines, onprem.step_limit, onprem.capacity_backoff) == (300.0, 100, 10, 180)
    assert policy.step_limit == 13  # the global window never binds before a provider's own
    assert executor_settings_from(config, policy).provider_timeouts == {"spot": 300.0, "onprem": 1200.0}
    clients = {n: PluginClient(FakeProvider(n)) for n in ("spot", "onprem")}
    core = DaemonCore(config, connect=unreachable, events=EventLog(), providers=clients)
    cycles = core.pieces.orphan_cycles()
    assert {n: c.policy.join_deadline for n, (c, _) in cycles.items()} == {"spot": 120.0, "onprem": 1800.0}
    injected = attrs.evolve(policy, providers={**policy.providers, "spot": attrs.evolve(spot, join_deadline=42.0)})
    core = DaemonCore(config, connect=unreachable, events=EventLog(), providers=clients, policy=injected)
    assert core.pieces.orphan_cycles()["spot"][0].policy.join_deadline == 42.0
