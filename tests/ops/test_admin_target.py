"""``--config FILE`` names the running daemon's admin socket even when the file no longer loads as a whole (issue 32
item 5: ``status`` exited 1 while the file on disk was broken, which is when it is needed after a failed reload)."""

from __future__ import annotations

import argparse

import pytest

from provisionerd.cli.admin_target import TargetError, socket_of


def target(path) -> argparse.Namespace:
    return argparse.Namespace(socket=None, config=path)


def test_a_config_that_fails_its_schema_still_names_its_socket(tmp_path):
    config = tmp_path / "pd.toml"
    config.write_text('cluster = "c"\n[daemon]\nadmin_socket = "run/admin.sock"\nlog_level = "loud"\n')
    assert socket_of(target(config)) == (tmp_path / "run" / "admin.sock").resolve()  # relative: as the loader has it


def test_a_file_that_is_not_toml_says_to_use_socket(tmp_path):
    config = tmp_path / "pd.toml"
    config.write_text("[daemon\nadmin_socket = ")
    with pytest.raises(TargetError, match="--socket PATH"):
        socket_of(target(config))


def test_a_broken_file_without_a_socket_says_so(tmp_path):
    config = tmp_path / "pd.toml"
    config.write_text('cluster = 3\n[daemon]\nlog_level = "info"\n')
    with pytest.raises(TargetError, match="names no daemon.admin_socket"):
        socket_of(target(config))
