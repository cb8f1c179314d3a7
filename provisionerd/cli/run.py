"""``provisionerd run --config FILE``: run the daemon until SIGTERM/SIGINT; SIGHUP re-reads the config.

A config with problems at start: every problem is printed and the exit code is 1. SIGHUP (or ``provisionerd
reload``, through the admin socket: what the shipped unit's ``ExecReload=`` runs) is one atomic reload
(``DaemonCore.reload``, rules in ``daemon.current_config``): a bad config is reported (event
``config_reload_failed`` with the problems) and the running one is kept; otherwise every change that applies live
(provider limits and policy, orphan settings, the log level, the metrics address) is switched to at once, as a
whole, and every change that needs a restart (controller, identity, TLS, the provider set, a provider's transport
or path, ...) keeps its running value and is named in the log (``config_restart_needed``, WARNING), in the event
``config_reloaded`` (``restart_needed``) and in ``status`` (``reload``). Under systemd each reload is bracketed by
RELOADING=1 and READY=1 with its result (``daemon.systemd``).
SIGTERM and SIGINT release every lease (bounded) and exit 0. An admin socket directory that another user could
change refuses the start with exit 2 (``InsecurePath``), and so does an admin socket another live daemon serves
(``AdminSocketInUse``: a second start of the same config; the message names the process that holds it).
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
from provisionerd.daemon.admin_socket import AdminSocketInUse, prepare_socket_dir, refuse_if_in_use
from provisionerd.daemon.current_config import ReloadResult
from provisionerd.daemon.root import DaemonCore
from provisionerd.domain.errors import ConfigError, InsecurePath
from provisionerd.provider.schemas import contract as contract_schemas
from provisionerd.telemetry.sd_notify import SdNotifier

log = logging.getLogger("provisionerd")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _apply_log_level(config: Config) -> None:
    logging.getLogger().setLevel(LEVELS[config.daemon.log_level])


class _Reloads:
    """What a reload changes in this process besides the daemon (the log level), and systemd's notifications."""

    def __init__(self, notifier: SdNotifier) -> None:
        self.systemd = systemd.SystemdReloads(notifier)

    def reloading(self) -> None:
        self.systemd.reloading()

    def reloaded(self, result: ReloadResult, config: Config) -> None:
        if result.outcome == "applied":
            _apply_log_level(config)
        self.systemd.reloaded(result, config)


async def _main(config: Config) -> None:
    notifier = SdNotifier.from_env()
    core = DaemonCore(config, reload_watcher=_Reloads(notifier))
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(core.run)
            notify = await nursery.start(systemd.for_core(core, notifier).run)  # Type=notify: READY, STATUS, WATCHDOG
            async for signum in signals:
                if signum == signal.SIGHUP:
                    core.reload()
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
    contract_schemas()  # compiled once per process (~0.1 s): here, not in the first provider call's loop step
    try:
        trio.run(_main, config)
    except ConfigError as exc:  # the TLS files could not be loaded
        print(f"provisionerd run: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:  # raised inside the daemon's nursery (a metrics address that cannot be bound)
        in_use = group.subgroup(AdminSocketInUse)  # lost a race with another start of this config
        if in_use is not None:
            for leaf in _leaves(in_use):
                print(f"provisionerd run: refusing to start: {leaf}", file=sys.stderr)
            return 2
        found = group.subgroup(ConfigError)
        if found is None:
            raise
        for leaf in _leaves(found):
            print(f"provisionerd run: {leaf}", file=sys.stderr)
        return 1
    return 0


def _leaves(group: BaseExceptionGroup[Exception]) -> list[BaseException]:
    return [
        leaf for exc in group.exceptions for leaf in (_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    ]


def _refuse_insecure_paths(config: Config) -> int | None:
    """Exit 2 on an admin socket directory another user could change (``InsecurePath``) or an admin socket another
    live daemon serves (``AdminSocketInUse``), before anything starts (the events file is not even opened)."""
    socket = config.daemon.admin_socket
    try:
        if socket is not None:
            prepare_socket_dir(socket)
            refuse_if_in_use(socket)
    except (InsecurePath, AdminSocketInUse, OSError) as exc:
        print(f"provisionerd run: refusing to start: {exc}", file=sys.stderr)
        return 2
    return None
