"""Two lifecycle gaps closed: the planner's provisioning timeout comes from the config (per provider), and a
throttled ``getAvailableTemplates`` backs the provider off like any other throttled call."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import trio
from lifecycle_fakes import BootingProvider
from lifecycle_rig import BASE, build_rig, item, start_rig
from rigs.daemon import parsed_config

from provisionerd.config.loader import Config
from provisionerd.daemon.builder import policy_from_config
from provisionerd.domain.errors import ConfigError, ProviderRejected
from provisionerd.domain.model import InstanceFact

PROVIDERS = textwrap.dedent(
    """
    [[providers]]
    name = "a"
    transport = "oneshot"
    path = "plugins/a"
    {a}
    [[providers]]
    name = "b"
    transport = "oneshot"
    path = "plugins/b"
    {b}
    """
)


def config(tmp_path: Path, a: str = "", b: str = "") -> Config:
    return parsed_config(tmp_path, PROVIDERS.format(a=a, b=b))


def test_provisioning_timeout_is_configured_per_provider_and_the_planner_keeps_each_providers_own(tmp_path):
    assert config(tmp_path).provider("a").provisioning_timeout == 1200.0
    assert policy_from_config(config(tmp_path)).of("a").provisioning_timeout == 1200.0  # the default, as before
    both = config(tmp_path, "provisioning_timeout = 300", "provisioning_timeout = 450.5")
    assert both.provider("a").provisioning_timeout == 300.0
    policy = policy_from_config(both)
    assert (policy.of("a").provisioning_timeout, policy.of("b").provisioning_timeout) == (300.0, 450.5)


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "providers[0].provisioning_timeout: 0 is less than or equal to the minimum of 0"),
        ("-5", "providers[0].provisioning_timeout: -5 is less than or equal to the minimum of 0"),
        ('"600"', "providers[0].provisioning_timeout: '600' is not of type 'number'"),
        ("100000", "providers[0].provisioning_timeout: 100000 is greater than the maximum of 86400"),
    ],
)
def test_a_bad_provisioning_timeout_is_named(tmp_path, value, message):
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, f"provisioning_timeout = {value}")
    assert list(caught.value.problems) == [message]


def test_unknown_provider_keys_are_still_rejected(tmp_path):
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, "provisioning_timeout = 60\nprovisioning_timout = 60")
    assert list(caught.value.problems) == ["providers[0].provisioning_timout: unknown key"]


def test_a_throttled_template_read_backs_the_provider_off(mock_run):
    seen: dict = {}

    async def main():
        provider = BootingProvider("p", {"small": 10}, launch_time=int(BASE))
        provider.fail_next(
            "getAvailableTemplates", ProviderRejected("p", "getAvailableTemplates", "throttled", "slow down")
        )
        async with trio.open_nursery() as nursery:
            # The offers come back at 0.5 s (the next read), well inside the first back-off window (1-2 s).
            rig = build_rig(nursery, {"p": provider}, offer_interval=0.5)
            rig.session.set_demand(1, item("d", 1))
            await start_rig(nursery, rig)  # the feed's first read (t=0) is the throttled one
            # Its observation reaches the loop on the feedback channel (execution.feedback), folded at once.
            await rig.wait_for(lambda: "p" in rig.loop.state.capacity.throttles)
            window = rig.loop.state.capacity.throttles["p"].until - BASE
            await rig.wait_for(lambda: rig.facts(InstanceFact))
            seen.update(rig=rig, window=window, provider=provider)
            nursery.cancel_scope.cancel()

    mock_run(main)
    window, provider = seen["window"], seen["provider"]
    reads = [t for t, action in provider.call_log if action == "getAvailableTemplates"]
    requests = [t for t, action in provider.call_log if action == "requestMachines"]
    assert reads[:2] == [0.0, 0.5]  # offers were fresh again at 0.5 s...
    assert 1.0 <= window <= 2.0  # ...but the throttle's window (base 2 s, jittered to 1-2 s)...
    assert requests[0] == pytest.approx(window, abs=1e-5)  # ...held the request back until it ended
