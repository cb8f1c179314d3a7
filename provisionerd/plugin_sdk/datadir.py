"""The plugin's data directory, ``$PRO_DATA_DIR``: the state it keeps across calls and restarts.

``data_dir`` finds it, ``private_dirs`` makes the subdirectories a store keeps its records in (mode 0700, made
0700 if they existed with another mode). Both fail as ``provider_error``: the plugin's environment is broken, not
the daemon's request (as with the configuration, ``config.CONTRACT_CODE``). Records are written with
``atomic.write_private``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from provisionerd.plugin_sdk.errors import PluginError

PRIVATE_DIR = 0o700


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$PRO_DATA_DIR``. Raises ``PluginError("provider_error")`` when it is not set."""
    value = (os.environ if environ is None else environ).get("PRO_DATA_DIR", "")
    if not value:
        raise PluginError("provider_error", "PRO_DATA_DIR is not set: the plugin keeps its records there")
    return Path(value)


def private_dirs(root: Path, names: Iterable[str]) -> None:
    """``root/<name>`` for each name, as 0700 directories (``root`` made too). Raises ``PluginError``."""
    try:
        for name in names:
            (root / name).mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
            os.chmod(root / name, PRIVATE_DIR)
    except OSError as exc:
        raise PluginError("provider_error", f"cannot use the data directory {str(root)!r}: {exc.strerror}") from None


def record_name(key: str, length: int = 40) -> str:
    """A file name for the record of ``key`` (a requestId, an op_id, a pod name): the first ``length`` hex digits
    of its SHA-256, so no input can pick a path."""
    return hashlib.sha256(key.encode()).hexdigest()[:length]
