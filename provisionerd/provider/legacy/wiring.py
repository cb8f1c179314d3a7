"""Wiring legacy mode into a daemon: the ``[providers.legacy]`` table and the client a provider gets.

    [[providers]]
    name = "aws-lsf"
    transport = "oneshot"
    path = "/opt/lsf/10.1/resource_connector/aws/scripts"
    [providers.legacy]
    rc_account = "default"
    journal = "/var/lib/provisionerd/aws-lsf.journal.json"
    state_file = "awsv2"        # the plugin's own records ($PRO_DATA_DIR/aws-db.json), read for the orphan report
    [providers.legacy.user_data]
    PROVISIONERD_JOIN_TOKEN = "{join_token}"
    PROVISIONERD_CONTROLLERS = "{controllers}"

``legacy_settings`` checks such a table (every problem listed in one ``ConfigError``); ``client_for`` gives a
one-shot provider its client: the legacy adapter when the plugin directory is a legacy plugin, else the plain
one-shot client. Pure apart from looking at the plugin directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provisionerd.domain.errors import ConfigError
from provisionerd.provider.legacy.adapter import LegacyProvider, LegacySettings, detect_legacy
from provisionerd.provider.legacy.rules import UserDataTemplate
from provisionerd.provider.legacy.state_files import READERS
from provisionerd.provider.oneshot import OneShotProvider

_KEYS = {"user_data", "rc_account", "journal", "max_ops", "state_file"}


def legacy_settings(table: Mapping[str, Any], where: str = "providers.legacy") -> LegacySettings:
    """``LegacySettings`` from a config table; ``ConfigError`` with every problem."""
    problems = [f"{where}.{key}: unknown setting (known: {sorted(_KEYS)})" for key in table if key not in _KEYS]
    user_data = UserDataTemplate()
    raw = table.get("user_data", {})
    if not isinstance(raw, Mapping):
        problems.append(f"{where}.user_data: must be a table of strings")
    else:
        try:
            user_data = UserDataTemplate.parse(raw, f"{where}.user_data")
        except ConfigError as exc:
            problems.extend(exc.problems)
    rc_account = table.get("rc_account", "default")
    if not isinstance(rc_account, str) or not 0 < len(rc_account) <= 256:
        problems.append(f"{where}.rc_account: must be a string of 1-256 characters")
    journal = table.get("journal", "")
    if not isinstance(journal, str):
        problems.append(f"{where}.journal: must be a path")
    max_ops = table.get("max_ops", 4096)
    if not isinstance(max_ops, int) or isinstance(max_ops, bool) or not 1 <= max_ops <= 1_000_000:
        problems.append(f"{where}.max_ops: must be an integer from 1 to 1000000")
    state_file = table.get("state_file", "")
    if state_file != "" and state_file not in READERS:
        problems.append(f"{where}.state_file: unknown layout {state_file!r} (known: {sorted(READERS)})")
    if problems:
        raise ConfigError("invalid legacy provider settings", problems)
    return LegacySettings(
        user_data=user_data, rc_account=rc_account, journal_path=journal, max_ops=max_ops, state_file=state_file
    )


def client_for(
    runner: OneShotProvider, settings: LegacySettings | None = None, *, force: bool = False
) -> OneShotProvider | LegacyProvider:
    """The client for a one-shot provider: ``LegacyProvider`` over it when its directory is a legacy LSF plugin
    (or always, with ``force``: the operator's ``mode = true``).

    A legacy plugin without a ``journal`` path still runs, but a daemon restart then forgets which requestIds the
    plugin gave (an open request is then recovered as unknown); the journal's directory must exist and must not be
    the plugin's own data directory (that belongs to the plugin)."""
    if not force and not detect_legacy(Path(runner.config.path), "oneshot"):
        return runner
    settings = settings or LegacySettings()
    if settings.journal_path and runner.config.data_dir:
        journal = Path(settings.journal_path).resolve()
        if Path(runner.config.data_dir).resolve() in journal.parents:
            raise ConfigError(
                "invalid legacy provider settings",
                [f"journal {settings.journal_path!r} is inside the plugin's data_dir"],
            )
    return LegacyProvider(runner, settings)
