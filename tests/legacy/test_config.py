"""The ``[providers.legacy]`` table and the choice of client for a one-shot provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisionerd.errors import ConfigError
from provisionerd.provider.legacy import LegacyProvider
from provisionerd.provider.legacy_config import client_for, legacy_settings
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import ProviderConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "providers" / "examples" / "lsf_legacy"


def test_a_good_table():
    settings = legacy_settings({"user_data": {"TOKEN": "{join_token}"}, "rc_account": "acct", "journal": "/j",
                                "max_ops": 10})
    assert settings.user_data.carries_token and settings.rc_account == "acct"
    assert settings.journal_path == "/j" and settings.max_ops == 10
    assert legacy_settings({}).user_data.values == {}  # by default no userData at all: no secret leaves


def test_every_problem_is_listed():
    with pytest.raises(ConfigError) as caught:
        legacy_settings({"user_data": {"T": "{secret}"}, "rc_account": "", "journal": 3, "max_ops": 0, "x": 1})
    problems = "\n".join(caught.value.problems)
    for expected in ("providers.legacy.x: unknown setting", "user_data.T: unknown placeholder {secret}",
                     "rc_account", "journal", "max_ops"):
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
