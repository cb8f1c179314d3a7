"""A plugin's configuration file, ``$PRO_CONF_DIR/<name>.json``: found, read, parsed and checked, or refused with a
typed ``ConfigError``.

Every way a configuration can fail is its own ``ConfigError`` subclass, and ``CONTRACT_CODE`` is the one place
that says which contract error code each is answered with. All of them are ``provider_error``: the contract's
``invalid_request`` says *the input is wrong* (the daemon's call), and the daemon acts on it by marking the provider
unhealthy for a bad request; an unset, unreadable, oversized or invalid configuration is the plugin's own set-up,
which the table in docs/providers.md names under ``provider_error`` ("its config is broken"). No retry helps until an
operator fixes the file, which ``provider_error`` (not retryable) says too.

``json`` and the standard library only; ``check_schema`` imports ``jsonschema`` when it is called.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.errors import PluginError

MAX_CONFIG_BYTES = 1 << 20


class ConfigError(PluginError):
    """The configuration cannot be used. ``path`` names the file (None when no file could be named)."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(CONTRACT_CODE[type(self)], message)
        self.path = None if path is None else os.fspath(path)


class ConfigNotSet(ConfigError):
    """``PRO_CONF_DIR`` is not set, and the plugin has no default."""


class ConfigUnreadable(ConfigError):
    """The file is missing or cannot be read (permissions, a directory, an I/O error)."""


class ConfigTooLarge(ConfigError):
    """The file is larger than the plugin reads (``MAX_CONFIG_BYTES`` by default)."""


class ConfigNotJson(ConfigError):
    """The file is not JSON."""


class ConfigInvalid(ConfigError):
    """The document breaks the plugin's schema or its own rules (``problems`` lists what, by JSON path)."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None, problems: tuple[str, ...] = ()):
        super().__init__(message, path)
        self.problems = problems


#: The one mapping of configuration failures to contract error codes (see the module docstring for why).
CONTRACT_CODE: Mapping[type[ConfigError], str] = {
    ConfigError: "provider_error",
    ConfigNotSet: "provider_error",
    ConfigUnreadable: "provider_error",
    ConfigTooLarge: "provider_error",
    ConfigNotJson: "provider_error",
    ConfigInvalid: "provider_error",
}


def config_path(file_name: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$PRO_CONF_DIR/<file_name>``. Raises ``ConfigNotSet``."""
    conf_dir = (os.environ if environ is None else environ).get("PRO_CONF_DIR", "")
    if not conf_dir:
        raise ConfigNotSet(f"PRO_CONF_DIR is not set: the plugin needs {file_name}")
    return Path(conf_dir) / file_name


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """The JSON document in ``path``. Raises ``ConfigUnreadable``, ``ConfigTooLarge`` or ``ConfigNotJson``."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigUnreadable(f"cannot read {os.fspath(path)}: {exc.strerror or exc}", path) from None
    if len(data) > max_bytes:
        raise ConfigTooLarge(f"{os.fspath(path)} is larger than {max_bytes} bytes", path)
    try:
        return json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError included
        raise ConfigNotJson(f"{os.fspath(path)} is not JSON: {exc}", path) from None


def load_config(
    file_name: str, environ: Mapping[str, str] | None = None, max_bytes: int = MAX_CONFIG_BYTES
) -> tuple[Any, Path]:
    """``(document, path)`` of ``$PRO_CONF_DIR/<file_name>``. Raises a ``ConfigError``."""
    path = config_path(file_name, environ)
    return read_json(path, max_bytes), path


def schema_problems(
    schema: Mapping[str, Any], doc: Any, formats: Mapping[str, Callable[[object], bool]] | None = None
) -> list[str]:
    """Every way ``doc`` breaks ``schema`` (its own ``$schema`` draft), as ``"<json path>: <why>"``, in path order.
    ``formats`` adds format checks (jsonschema alone does not check ``date-time``). Needs ``jsonschema``."""
    import jsonschema

    checker = jsonschema.FormatChecker()
    for name, check in (formats or {}).items():
        checker.checks(name)(check)
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=checker)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:200]}" for e in errors]


def check_schema(
    schema: Mapping[str, Any], doc: Any, where: str, formats: Mapping[str, Callable[[object], bool]] | None = None
) -> None:
    """Raise ``ConfigInvalid`` naming the first five problems of ``doc`` (``where``: the file's name)."""
    problems = schema_problems(schema, doc, formats)
    if problems:
        raise ConfigInvalid(f"{where}: " + "; ".join(problems[:5]), where, tuple(problems))
