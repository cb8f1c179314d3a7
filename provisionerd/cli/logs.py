"""``--log-format text|json`` for the long-running commands, and the daemon's log setup from its config."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provisionerd.telemetry.log_collapse import COLLAPSE_WINDOW
from provisionerd.telemetry.logging_setup import LOG_FORMATS, RedactingFormatter, config_secrets, configure_logging
from provisionerd.telemetry.redaction import Redactor

if TYPE_CHECKING:  # an annotation only: the agent sets up its logs here too and loads no config
    from provisionerd.config.loader import Config


def add_log_format_argument(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    where = "" if default is not None else " (default: [daemon] log_format, else text)"
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default,
        help=f"the log on stderr: text, or json (one object per line){where}",
    )


def setup_daemon_logging(config: Config, log_format: str | None) -> RedactingFormatter:
    """The daemon's stderr log: the config's level, ``--log-format`` or the config's format, every provider
    credential value redacted from every line (the provider runtime's ``Redactor``), and a line repeated within
    ``COLLAPSE_WINDOW`` seconds counted instead of written again."""
    return configure_logging(
        config.daemon.log_level,
        log_format or config.daemon.log_format,
        redact=Redactor().including(config_secrets(config.providers)),
        collapse=COLLAPSE_WINDOW,
    )
