"""The ``[providers.legacy]`` table and the choice of client for a one-shot provider."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from rigs.daemon import parsed_config

from provisionerd.config.loader import Config
from provisionerd.daemon.clients import provider_clients
from provisionerd.domain.errors import ConfigError
from provisionerd.provider.legacy.adapter import LegacyProvider
from provisionerd.provider.legacy.wiring import client_for, legacy_settings
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import ProviderConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "providers" / "examples" / "lsf_legacy"


def transports(config):
    """The transport under each typed client the daemon would build (what the legacy detection chose)."""
    return {name: client.transport for name, client in provider_clients(config).items()}


def test_a_good_table():
    settings = legacy_settings(
        {"user_data": {"TOKEN": "{join_token}"}, "rc_account": "acct", "journal": "/j", "max_ops": 10}
    )
    assert settings.user_data.carries_token and settings.rc_account == "acct"
    assert settings.journal_path == "/j" and settings.max_ops == 10
    assert legacy_settings({}).user_data.values == {}  # by default no userData at all: no secret leaves


def test_every_problem_is_listed():
    with pytest.raises(ConfigError) as caught:
        legacy_settings({"user_data": {"T": "{secret}"}, "rc_account": "", "journal": 3, "max_ops": 0, "x": 1})
    problems = "\n".join(caught.value.problems)
    for expected in (
        "providers.legacy.x: unknown setting",
        "user_data.T: unknown placeholder {secret}",
        "rc_account",
        "journal",
        "max_ops",
    ):
        assert expected in problems


def test_client_for_chooses_by_the_plugin_directory(tmp_path):
    legacy = client_for(OneShotProvider(ProviderConfig(name="l", cluster="c", path=str(EXAMPLE))))
    assert isinstance(legacy, LegacyProvider) and legacy.features["listMachines"] is False
    ours = OneShotProvider(ProviderConfig(name="b", cluster="c", path=str(REPO / "providers" / "examples" / "bash")))
    assert client_for(ours) is ours


def test_the_journal_may_not_live_in_the_plugins_data_dir(tmp_path):
    runner = OneShotProvider(ProviderConfig(name="l", cluster="c", path=str(EXAMPLE), data_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="inside the plugin's data_dir"):
        client_for(runner, legacy_settings({"journal": str(tmp_path / "j.json")}))


def daemon_config(tmp_path: Path, plugin: Path, legacy: str = "", transport: str = "oneshot") -> Config:
    provider = f"""
        [[providers]]
        name = "lsf"
        transport = "{transport}"
        path = "{plugin}"
        data_dir = "data"
    """
    return parsed_config(tmp_path, textwrap.dedent(provider) + textwrap.dedent(legacy))


def test_the_daemon_runs_a_legacy_plugin_through_the_adapter_with_the_configured_settings(tmp_path):
    config = daemon_config(
        tmp_path,
        EXAMPLE,
        """
        [providers.legacy]
        rc_account = "hpc"
        journal = "state/lsf.journal.json"
        max_ops = 50
        [providers.legacy.user_data]
        PROVISIONERD_JOIN_TOKEN = "{join_token}"
    """,
    )
    options = config.provider("lsf").legacy
    assert options.mode == "auto" and options.journal == tmp_path / "state" / "lsf.journal.json"
    client = transports(config)["lsf"]
    assert isinstance(client, LegacyProvider)
    assert client.settings.rc_account == "hpc" and client.settings.max_ops == 50
    assert client.settings.journal_path == str(tmp_path / "state" / "lsf.journal.json")
    assert client.settings.user_data.carries_token
    # Without a table, auto-detection alone: the example is legacy, the bash example is not.
    assert isinstance(transports(daemon_config(tmp_path, EXAMPLE))["lsf"], LegacyProvider)
    bash = REPO / "providers" / "examples" / "bash"
    assert type(transports(daemon_config(tmp_path, bash))["lsf"]) is OneShotProvider
    # A mistyped or empty directory is not taken for an LSF plugin: its calls fail as they always did.
    assert type(transports(daemon_config(tmp_path, tmp_path / "no-such-dir"))["lsf"]) is OneShotProvider


def test_mode_true_forces_and_mode_false_forbids_the_adapter(tmp_path):
    bash = REPO / "providers" / "examples" / "bash"
    forced = transports(daemon_config(tmp_path, bash, "[providers.legacy]\nmode = true\n"))["lsf"]
    assert isinstance(forced, LegacyProvider)
    plain = transports(daemon_config(tmp_path, EXAMPLE, "[providers.legacy]\nmode = false\n"))["lsf"]
    assert type(plain) is OneShotProvider
    auto = daemon_config(tmp_path, EXAMPLE, '[providers.legacy]\nmode = "auto"\n')
    assert isinstance(transports(auto)["lsf"], LegacyProvider)


@pytest.mark.parametrize(
    "table, problem",
    [
        ("[providers.legacy]\nuserdata = {}\n", "providers[0].legacy.userdata: unknown key"),
        ('[providers.legacy]\nmode = "yes"\n', "providers[0].legacy.mode: 'yes' is not one of ['auto', True, False]"),
        ("[providers.legacy]\nmode = 1\n", "providers[0].legacy.mode: 1 is not one of ['auto', True, False]"),
        ('[providers.legacy.user_data]\nT = "{secret}"\n', "providers[0].legacy.user_data.T: unknown placeholder"),
        ('[providers.legacy]\nrc_account = ""\n', "providers[0].legacy.rc_account: '' should be non-empty"),
    ],
)
def test_a_bad_legacy_table_is_refused_when_the_config_loads(tmp_path, table, problem):
    with pytest.raises(ConfigError) as caught:
        daemon_config(tmp_path, EXAMPLE, table)
    assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(problem)


def test_legacy_mode_is_for_one_shot_plugins_only(tmp_path):
    with pytest.raises(ConfigError) as caught:
        daemon_config(tmp_path, EXAMPLE, '[providers.legacy]\nrc_account = "x"\n', transport="persistent")
    assert list(caught.value.problems) == [
        "providers[0].legacy: an LSF plugin is one-shot: legacy mode needs transport 'oneshot'"
    ]
