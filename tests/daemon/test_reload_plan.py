"""Which differences a reload applies live and which need a restart (``daemon.current_config``), and the holder's
atomic switch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest

from provisionerd.config.loader import Config
from provisionerd.daemon.current_config import CurrentConfig, plan_reload

CONFIG = textwrap.dedent(
    """
    cluster = "c1"
    identity = "p1"
    [controller]
    addresses = ["ctl-a:7400"]
    [tls]
    ca = "ca.pem"
    cert = "p.pem"
    key = "p.key"
    [[providers]]
    name = "a"
    transport = "oneshot"
    path = "plugins/a"
    env = {SECRET = "do-not-show-me"}
    [[providers]]
    name = "b"
    transport = "oneshot"
    path = "plugins/b"
    """
)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config.from_toml(CONFIG, base_dir=tmp_path)


def provider(config: Config, which: str, **changes) -> Config:
    providers = tuple(attrs.evolve(p, **changes) if p.name == which else p for p in config.providers)
    return attrs.evolve(config, providers=providers)


def test_policy_orphan_and_log_level_changes_are_live(config):
    new = provider(config, "a", max_machines=7, step_limit=3, join_deadline=60.0, idle_time=5.0, max_ttl=3600.0)
    new = provider(new, "b", capacity_backoff=9.0, quota_pause=99.0, unhealthy_backoff=3.0, unhealthy_backoff_max=30.0)
    new = provider(new, "b", orphans=attrs.evolve(config.provider("b").orphans, action="stop", grace=5.0))
    new = attrs.evolve(new, daemon=attrs.evolve(config.daemon, log_level="debug"))
    plan = plan_reload(config, new)
    assert plan.restart == ()
    assert set(plan.live) == {
        "daemon.log_level",
        *(f"providers.a.{k}" for k in ("max_machines", "step_limit", "join_deadline", "idle_time", "max_ttl")),
        *(f"providers.b.{k}" for k in ("capacity_backoff", "quota_pause", "unhealthy_backoff")),
        "providers.b.unhealthy_backoff_max",
        "providers.b.orphans.action",
        "providers.b.orphans.grace",
    }


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda c: attrs.evolve(c, identity="p2"), "identity"),
        (lambda c: attrs.evolve(c, cluster="c2"), "cluster"),
        (lambda c: attrs.evolve(c, controller=attrs.evolve(c.controller, addresses=("x:1",))), "controller.addresses"),
        (lambda c: attrs.evolve(c, tls=attrs.evolve(c.tls, key=Path("/k"))), "tls.key"),
        (lambda c: attrs.evolve(c, lease=attrs.evolve(c.lease, margin=1.0)), "lease.margin"),
        (lambda c: attrs.evolve(c, daemon=attrs.evolve(c.daemon, admin_socket=Path("/s"))), "daemon.admin_socket"),
        (lambda c: provider(c, "a", transport="persistent"), "providers.a.transport"),
        (lambda c: provider(c, "a", path=Path("/other")), "providers.a.path"),
        (lambda c: provider(c, "a", env={"SECRET": "changed"}), "providers.a.env"),
        (lambda c: provider(c, "a", provisioning_timeout=60.0), "providers.a.provisioning_timeout"),
        (lambda c: provider(c, "a", name="a2"), "providers (added ['a2'], removed ['a'])"),
        (lambda c: attrs.evolve(c, providers=c.providers[:1]), "providers (added [], removed ['b'])"),
    ],
)
def test_what_needs_a_restart_is_named(config, change, named):
    plan = plan_reload(config, change(config))
    assert named in plan.restart
    assert "do-not-show-me" not in repr(plan) and "changed" not in repr(plan.restart)


def test_the_order_of_providers_and_the_source_are_not_changes(config, tmp_path):
    new = attrs.evolve(config, providers=tuple(reversed(config.providers)), source=tmp_path / "other.toml")
    assert not plan_reload(config, new).changed


def test_the_holder_applies_the_live_part_and_names_what_needs_a_restart(config):
    current = CurrentConfig(config, wall=lambda: 1000.0)
    running, policy = current.config, current.policy
    only_restart = attrs.evolve(config, identity="p2")
    result = current.reload(only_restart)
    assert result.outcome == "restart_needed" and result.restart_needed == ("identity",) and result.applied == ()
    assert current.policy is policy and current.config.identity == running.identity

    mixed = provider(attrs.evolve(config, identity="p2"), "a", max_machines=7)
    result = current.reload(mixed)
    assert result.outcome == "applied" and result.applied == ("providers.a.max_machines",)
    assert result.restart_needed == ("identity",)
    assert current.config.identity == running.identity  # the restart-only value stays
    assert current.policy.of("a").max_machines == 7 and current.config.provider("a").max_machines == 7
    assert plan_reload(current.config, mixed).live == ()  # everything live of the file is in force
    current = CurrentConfig(config, wall=lambda: 1000.0)
    running, policy = current.config, current.policy

    bad = provider(config, "a", join_deadline=-1.0)  # not loadable from a file; built here to reach the check
    result = current.reload(bad)
    assert result.outcome == "failed" and any("join_deadline" in p for p in result.problems)
    assert current.config is running and current.policy is policy

    good = provider(config, "a", max_machines=7)
    result = current.reload(good)
    assert result.outcome == "applied" and result.applied == ("providers.a.max_machines",)
    assert current.config == good and current.policy.of("a").max_machines == 7
    assert result.previous is running and running.provider("a").max_machines == 100  # what it replaced
    assert current.orphan_policy("a").join_deadline == current.policy.of("a").join_deadline
    assert current.reload(good).outcome == "unchanged"
    assert current.status() == {
        "reloads": 3,
        "last": {"outcome": "unchanged", "at": 1000.0, "applied": [], "restart_needed": [], "problems": []},
    }


def test_a_fixed_policy_is_kept_across_a_reload(config):
    from provisionerd.planner.policy import Policy

    fixed = Policy(cluster="c1", join_deadline=42.0)
    current = CurrentConfig(config, policy=fixed)
    assert current.reload(provider(config, "a", join_deadline=60.0)).outcome == "applied"
    assert current.policy is fixed and current.orphan_policy("a").join_deadline == 42.0


def test_a_provider_added_waits_for_a_restart_and_the_others_live_changes_apply(config):
    """The running providers keep running as they are configured now, with their new live knobs; the new one is
    named and not started (the provider set needs a restart)."""
    current = CurrentConfig(config, wall=lambda: 1000.0)
    added = attrs.evolve(config.providers[0], name="z-new")
    new = attrs.evolve(
        provider(attrs.evolve(config, daemon=attrs.evolve(config.daemon, log_format="json")), "a", idle_time=5.0),
        providers=(*provider(config, "a", idle_time=5.0).providers, added),
    )
    result = current.reload(new)
    assert result.outcome == "applied" and result.applied == ("providers.a.idle_time",)
    assert set(result.restart_needed) == {"daemon.log_format", "providers (added ['z-new'], removed [])"}
    assert current.config.provider_names == config.provider_names  # z-new waits for the restart
    assert current.config.daemon.log_format == config.daemon.log_format
    assert current.policy.of("a").idle_time == 5.0
