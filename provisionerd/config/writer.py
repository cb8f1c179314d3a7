"""The daemon's config file written from a ``Config`` value: the one typed way the demo, the tests and the benches
make a config, instead of each typing its own TOML.

The spec *is* the loader's own value (``provisionerd.config.loader.Config`` and its parts), so there is no second
list of fields to keep in step with the schema. ``daemon_config_toml(config)`` renders it with ``tomli-w``: every
field that differs from its default, in the file's vocabulary (``timeouts.return``, ``legacy.mode = true``), and
never ``source``. ``write_daemon_config(config, path)`` checks that text with the daemon's loader, writes it, and
returns what ``Config.from_file(path)`` reads back, so a file it writes is one the daemon accepts.

Paths are written as given: a relative one stays relative in the file and is resolved against the file's directory
when read, as in any config file. The file holds paths to TLS keys, never key material. A provider's ``env`` values
are credentials: they are written (that is what the table is for), into a file only its owner can read, and appear
in no error (the loader's ``ConfigError`` hides them) and no repr.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cattrs
import tomli_w
from cattrs.gen import make_dict_unstructure_fn, override

from provisionerd.config.loader import Config, LegacyOptions, ProviderTimeouts, TlsPaths
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import Role
from provisionerd.pki.certs import cert_paths
from provisionerd.plugin_sdk.atomic import write_private

#: ``LegacyOptions.mode`` -> its TOML value (the inverse of what the loader maps).
_LEGACY_MODE_TOML: dict[str, Any] = {"auto": "auto", "on": True, "off": False}


def provisioner_tls(certs_dir: Path | str) -> TlsPaths:
    """The provisioner's CA, certificate and key in a directory laid out by ``provisionerd certs init``."""
    ca, _ = cert_paths(certs_dir, "ca")
    cert, key = cert_paths(certs_dir, Role.PROVISIONER.value)
    return TlsPaths(ca=ca, cert=cert, key=key)


def daemon_config_toml(config: Config) -> str:
    """The TOML text of ``config``: only the fields that differ from their defaults; ``None`` means absent.

    Not validated: a value the loader would refuse is rendered as it is (``write_daemon_config`` checks).

    Raises:
        TypeError: a value TOML cannot hold (an object where the field's type says str, number or path).
    """
    return tomli_w.dumps(_without_none(_converter.unstructure(config, Config)))


def write_daemon_config(config: Config, path: Path | str) -> Config:
    """Write ``config`` to ``path`` (replaced atomically, mode 0600) and return ``Config.from_file(path)``.

    The text is checked by the daemon's loader before anything is written, so a refused value leaves ``path`` as
    it was. Relative paths in ``config`` are resolved against ``path``'s directory, in the check as in the file.

    Raises:
        ConfigError: the loader refuses the document (every problem, with its path; env values hidden), or the
            file cannot be written or read back.
        TypeError: as ``daemon_config_toml``.
    """
    path = Path(path)
    text = daemon_config_toml(config)
    Config.from_toml(text, base_dir=path.resolve().parent, name=str(path))
    _replace_private(path, text)
    return Config.from_file(path)


def _replace_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (``plugin_sdk.atomic.write_private``: a 0600 temporary file beside
    it, fsync, rename): a reader (a daemon reloading on SIGHUP) sees the old file or the new one, never half of one."""
    try:
        write_private(path, text.encode())
    except OSError as exc:
        raise ConfigError(f"cannot write config {str(path)!r}", [f"(file): {exc.strerror or exc}"]) from None


def _without_none(value: Any) -> Any:
    """TOML has no null: a key whose value is ``None`` is left out, which is what ``None`` means in the config."""
    if isinstance(value, Mapping):
        return {key: _without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_none(item) for item in value]
    return value


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(omit_if_default=True)
    converter.register_unstructure_hook(Path, str)

    def register(cls: type, **overrides: Any) -> None:
        # make_dict_unstructure_fn does not take the converter's omit_if_default on its own.
        hook: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(
            cls, converter, _cattrs_omit_if_default=True, **overrides
        )
        converter.register_unstructure_hook(cls, hook)

    # Innermost first: a class's function is generated with the hooks of its fields as registered at that moment.
    register(ProviderTimeouts, return_=override(rename="return"))
    # An unknown mode goes through as it is, for the loader to refuse by name.
    register(LegacyOptions, mode=override(unstruct_hook=lambda mode: _LEGACY_MODE_TOML.get(mode, mode)))
    register(Config, source=override(omit=True))
    return converter


_converter = _make_converter()
