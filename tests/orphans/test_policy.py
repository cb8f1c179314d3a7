"""The orphan knobs: defaults, every bad value reported at once, and the mapping from a provider's config."""

import math

import attrs
import pytest

from provisionerd.domain.errors import ConfigError
from provisionerd.orphans.classify import ClassifierMemory, CountedResource, OrphanPolicy


def test_defaults_match_the_issue():
    policy = OrphanPolicy()
    assert (policy.orphan_action, policy.join_deadline, policy.orphan_grace) == ("report", 900, 1800)
    assert (policy.dry_run, policy.ghost_confirmations, policy.protect_tag) == (False, 2, "provisionerd:protect")


def test_every_problem_is_reported_at_once():
    bad = dict(
        orphan_action="delete",
        join_deadline=0,
        orphan_grace=math.nan,
        max_cleanup_per_interval=True,
        breaker_max_failures=0,
        breaker_max_share=1.5,
        breaker_min_orphans=-1,
        protect_tag="",
        dry_run="yes",
        ghost_confirmations=1,
    )
    with pytest.raises(ConfigError) as info:
        OrphanPolicy(**bad)
    assert [p.split(":")[0] for p in info.value.problems] == list(bad)
    assert "'delete'" in info.value.problems[0]


@attrs.frozen
class FakeOrphanSettings:  # the shape of provisionerd.config.OrphanSettings
    action: str = "terminate"
    grace: float = 600.0
    max_cleanup_per_interval: int = 4
    protect_tag: str = "keep"
    dry_run: bool = True
    ghost_confirmations: int = 3


@attrs.frozen
class FakeProvider:  # the fields of provisionerd.config.ProviderConfig it reads
    name: str = "sim"
    join_deadline: float = 300.0
    orphans: object = FakeOrphanSettings()


def test_from_provider_config():
    policy = OrphanPolicy.from_provider_config(FakeProvider())
    assert policy == OrphanPolicy(
        orphan_action="terminate",
        join_deadline=300.0,
        orphan_grace=600.0,
        max_cleanup_per_interval=4,
        protect_tag="keep",
        dry_run=True,
        ghost_confirmations=3,
    )


def test_from_provider_config_reports_config_paths():
    provider = FakeProvider(join_deadline=-1, orphans=FakeOrphanSettings(action="nuke", ghost_confirmations=1))
    with pytest.raises(ConfigError) as info:
        OrphanPolicy.from_provider_config(provider)
    assert [p.split(":")[0] for p in info.value.problems] == [
        "providers.sim.orphans.action",
        "providers.sim.join_deadline",
        "providers.sim.orphans.ghost_confirmations",
    ]


def test_from_the_real_config_defaults():
    config = pytest.importorskip("provisionerd.config.loader")
    provider = config.ProviderConfig(name="sim", transport="oneshot")
    assert OrphanPolicy.from_provider_config(provider) == OrphanPolicy()


def test_classifier_inputs_refuse_nonsense():
    from orphan_world import World

    with pytest.raises(ValueError, match="granted"):
        CountedResource("lic", -1, 0)
    with pytest.raises(ValueError, match="in_use"):
        CountedResource("lic", 1, True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="failed_cleanups"):
        ClassifierMemory(failed_cleanups=-1)
    with pytest.raises(ValueError, match="now"):
        World().observe(now=math.nan)
    obs = World().observe(listing=[*World().listed("m1").listing])  # any sequence: stored as a tuple
    assert isinstance(obs.listing, tuple)
