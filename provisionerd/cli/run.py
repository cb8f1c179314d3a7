"""``provisionerd run --config FILE``: run the daemon until SIGTERM/SIGINT; SIGHUP re-reads the config.

A config with problems at start: every problem is printed and the exit code is 1. On SIGHUP a bad config is
reported (events ``config_reload_failed`` with the problems) and the running one is kept; a good one replaces the
log level at once, and sections that need a restart to take effect are named in ``config_reloaded``.
SIGTERM and SIGINT release every lease (bounded) and exit 0. An admin socket directory that another user could change
refuses the start with exit 2 (``InsecurePath``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

from provisionerd.cli.logs import add_log_format_argument, setup_daemon_logging
from provisionerd.config.loader import Config
from provisionerd.config.proofs import load_proven  # the proofs gate a start and every reload
from provisionerd.daemon import systemd
from provisionerd.daemon.admin_socket import prepare_socket_dir
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.errors import ConfigError, InsecurePath

log = logging.getLogger("provisionerd")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _reload(core: DaemonCore) -> None:
    source = core.config.source
    try:
        new = load_proven(source) if source is not None else core.config
    except ConfigError as exc:
        log.error("config reload failed; keeping the running config: %s", exc)
        core.events.emit("config_reload_failed", problems=list(exc.problems))
        return
    logging.getLogger().setLevel(LEVELS[new.daemon.log_level])
    old = core.config
    needs_restart = [
        name
        for name in ("cluster", "identity", "controller", "tls", "providers", "lease")
        if getattr(old, name) != getattr(new, name)
    ]
    core.config = new
    core.events.emit("config_reloaded", restart_needed=needs_restart)


async def _main(config: Config) -> None:
    core = DaemonCore(config)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(core.run)
            notify = await nursery.start(systemd.for_core(core).run)  # Type=notify: READY, STATUS, WATCHDOG
            async for signum in signals:
                if signum == signal.SIGHUP:
                    _reload(core)
                    continue
                core.events.emit("daemon_stopping", signal=signal.Signals(signum).name)
                notify.stopping()
                with trio.CancelScope(shield=True):
                    await core.release_leases()  # while the link is still up, so the controller hears it
                nursery.cancel_scope.cancel()
                break
    core.events.emit("daemon_stopped")
    core.events.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="provisionerd run", description="run the daemon")
    parser.add_argument("--config", required=True, help="the TOML config file")
    add_log_format_argument(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        config = load_proven(args.config)
    except ConfigError as exc:
        print(f"provisionerd run: {exc.args[0].splitlines()[0]}", file=sys.stderr)
        for problem in exc.problems:
            print(f"{args.config}: {problem}", file=sys.stderr)
        return 1
    setup_daemon_logging(config, args.log_format)
    if (refused := _refuse_insecure_paths(config)) is not None:
        return refused
    try:
        trio.run(_main, config)
    except ConfigError as exc:  # the TLS files could not be loaded
        print(f"provisionerd run: {exc}", file=sys.stderr)
        return 1
    return 0


def _refuse_insecure_paths(config: Config) -> int | None:
    """Exit 2 on an admin socket directory another user could change (``InsecurePath``), before anything starts."""
    socket = config.daemon.admin_socket
    try:
        if socket is not None:
            prepare_socket_dir(socket)
    except (InsecurePath, OSError) as exc:
        print(f"provisionerd run: refusing to start: {exc}", file=sys.stderr)
        return 2
    return None
