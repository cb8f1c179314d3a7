"""``provisionerd agent``: run the worker agent on this machine until it is returned.

    provisionerd agent --certs DIR --controllers HOST:PORT[,HOST:PORT...] --instance-ref REF
                       (--token-file PATH | --token-stdin)
                       [--identity NAME] [--machine-id ID] [--label KEY=VALUE ...]
                       [--heartbeat S] [--reply-timeout S] [--log-level LEVEL] [--log-format text|json]
                       [--orphan-timeout S [--on-orphan exit|shutdown] [--shutdown-command CMD]]
                       [--probe NAME=COMMAND ...] [--probe-timeout S] [--no-report-host] [--reprobe-interval S]
                       [--state-file PATH]
                       [--imds URL [--imds-interval S]]

The join token is read from a 0600 file (deleted once read) or from standard input up to EOF; there is no way to
pass it as an argument or through the environment. ``--machine-id`` and ``--label`` are informational: they are
logged and visible in the process list, which is how the local provider finds its agents by their tags.

``--state-file PATH``: keep what the next join presents (the token until the first join is accepted, then the
credential it was issued) in PATH, 0600, replaced atomically whenever it changes; a restarted agent (its machine's
init system restarting it after a crash) reads it instead of a token, so it rejoins as the same machine. The token
file is deleted only once the state file holds the token. Without it, the secret is in memory only and an agent
that dies cannot join again (``agent.saved``; docs/operations.md, "A machine that comes up before its fact").

``--orphan-timeout S``: when no controller has been heard for S seconds (counted from the start, so an agent that
never joins stops too), the agent exits with code 5; with ``--on-orphan shutdown`` it first runs
``--shutdown-command`` (default ``shutdown -h now``, no shell), for providers where a machine that shuts itself
down is terminated (EC2 launched with ``InstanceInitiatedShutdownBehavior=terminate``). Providers set these from
the daemon's ``worker_orphan_timeout`` (docs/fleet.md).

``--probe NAME=COMMAND``: measured once at start with the built-in ``ncpus``, ``mem``, ``type`` and ``ngpus`` (the
shipped ``nvidia-smi`` probe; ``--no-report-host`` leaves the four out), and sent with every join
(``provisionerd.agent.capabilities``); the daemon returns a machine whose report falls short of its template, or
does not confirm it. Probes come only from this command line (the provider's own config or the machine's
user data), never from the controller. ``--reprobe-interval S`` (default 300, 0 = never): the same probes run again
every S seconds (give or take 10 %), and a report that differs from the last one sent goes to the controller once
in a ``WorkerStatus`` (``provisionerd.agent.reprobe``; protocol §6.4 "Health after join"): the daemon drains a
machine whose re-probe falls short, replaces it and returns it.

``--imds URL`` (EC2: ``http://169.254.169.254``, which the shipped boot script passes): read spot interruption and
rebalance notices from the instance metadata service (IMDSv2) every ``--imds-interval`` seconds (default 5) and
report them to the controller (``provisionerd.agent.imds``; protocol §6.4 "Reclaim notices"), so the daemon
replaces the machine and returns it before the provider takes it.

A refused join (the token or credential refused, the primary refusing now) may mean "not yet": the machine booted
before the daemon committed its fact, or the controller lost its store and no admin has decided. The agent keeps its
secret in memory and joins again after 1 s, doubling up to 60 s; only ``--orphan-timeout`` ends that (exit code 3).
A protocol version or a role the controller does not accept ends it at once (exit code 4).

Signals: SIGTERM or SIGINT stop the agent (exit 0); SIGUSR1 reports ``busy``, SIGUSR2 reports ``idle``.
Exit codes: 0 stopped, 2 bad arguments or token file, 3 joins refused until ``--orphan-timeout``, 4 refused for
good (protocol version, role), 5 orphaned (no controller reached for ``--orphan-timeout``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio

from provisionerd.agent import capabilities, imds, reprobe
from provisionerd.agent.saved import SavedSecrets, StateFile
from provisionerd.agent.token import delete_token_file, read_token_file, read_token_stream
from provisionerd.agent.worker import (
    EXIT_ORPHANED,
    EXIT_STOPPED,
    EXIT_USAGE,
    AgentConfig,
    Connector,
    Credentials,
    JoinRefused,
    Orphaned,
    WorkerAgent,
)
from provisionerd.cli.logs import add_log_format_argument
from provisionerd.domain.errors import AuthError, ConfigError
from provisionerd.domain.model import HostStatus, Role
from provisionerd.telemetry.logging_setup import configure_logging
from provisionerd.telemetry.redaction import Redactor
from provisionerd.wire.tls import ClusterSSLContext, client_ssl_context, peer_role

log = logging.getLogger("provisionerd.agent")


def parse_address(text: str) -> str:
    """Check ``HOST:PORT`` (``[v6]:PORT`` for IPv6); returns it stripped. Raises ``ConfigError``."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"a controller address must look like HOST:PORT, not {text!r}")
    return text.strip()


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def tls_connector(certs_dir: Path) -> Connector:
    """TCP + mutual TLS with the ``worker`` certificate; the peer must be this cluster's controller.

    The TLS files are loaded at the first attempt and again after every failure to load them, so an agent that
    starts before its certificates arrive keeps trying (and says why) instead of dying.
    """
    context: ClusterSSLContext | None = None

    async def connect(address: str) -> trio.abc.Stream:
        nonlocal context
        if context is None:
            context = client_ssl_context(certs_dir, Role.WORKER)
        host, port = split_address(address)
        tcp = await trio.open_tcp_stream(host, port)
        stream = trio.SSLStream(tcp, context, server_hostname=host)
        try:
            await stream.do_handshake()
            role = peer_role(stream)
            if role is not Role.CONTROLLER:
                raise AuthError(f"{address} presented a {role.value} certificate, not a controller's")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream

    return connect


#: What ``--on-orphan shutdown`` runs by default: a halt, which terminates an EC2 instance launched with
#: ``InstanceInitiatedShutdownBehavior=terminate``.
DEFAULT_SHUTDOWN = "shutdown -h now"
#: How long the shutdown command may take before the agent exits anyway.
SHUTDOWN_WAIT = 60.0


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, not {text!r}")
    return key, value


def _probe(text: str) -> tuple[str, str]:
    try:
        return capabilities.parse_probe(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provisionerd agent",
        description="join the cluster controller as a worker and stay joined until returned",
        allow_abbrev=False,  # so "--token" can never be mistaken for a way to pass the token
    )
    parser.add_argument("--certs", required=True, type=Path, help="directory with ca.pem, worker.pem, worker.key")
    parser.add_argument("--controllers", required=True, help="HOST:PORT[,HOST:PORT...] of the controller replicas")
    parser.add_argument("--instance-ref", default="", help="this machine's instance reference")
    parser.add_argument(
        "--address-bound",
        action="store_true",
        help="join by --machine-id from the provider's address for it, the secret read being the cluster's bootstrap"
        " secret, not a join token (controller option --address-bound-join; docs/providers.md)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--token-file", type=Path, help="a 0600 file holding the join token (deleted once read)")
    source.add_argument("--token-stdin", action="store_true", help="read the join token from standard input")
    parser.add_argument("--identity", default="", help="the name to join with (default: the instance reference)")
    parser.add_argument(
        "--machine-id", default="", help="the provider's id for this machine (informational without --address-bound)"
    )
    parser.add_argument(
        "--label",
        action="append",
        type=_label,
        default=[],
        metavar="KEY=VALUE",
        help="informational label (repeatable), e.g. an owner tag",
    )
    parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats (default 5)")
    parser.add_argument(
        "--reply-timeout", type=float, default=15.0, help="seconds of silence before reconnecting (default 15)"
    )
    parser.add_argument(
        "--orphan-timeout",
        type=float,
        default=None,
        help="exit (code 5) after this many seconds without hearing any controller (default: never)",
    )
    parser.add_argument(
        "--on-orphan",
        choices=("exit", "shutdown"),
        default="exit",
        help="after the orphan timeout: just exit, or run --shutdown-command first (default exit)",
    )
    parser.add_argument(
        "--shutdown-command",
        default=DEFAULT_SHUTDOWN,
        help=f"what --on-orphan shutdown runs, split like a shell would, no shell (default {DEFAULT_SHUTDOWN!r})",
    )
    parser.add_argument(
        "--probe",
        action="append",
        type=_probe,
        default=[],
        metavar="NAME=COMMAND",
        help="a capability probe (repeatable, at most 4): COMMAND runs through /bin/sh at start (and every"
        " --reprobe-interval) and the first"
        " line it prints is reported as NAME, e.g. ngpus='nvidia-smi -L | wc -l'",
    )
    parser.add_argument("--probe-timeout", type=float, default=10.0, help="seconds each probe may take (default 10)")
    parser.add_argument(
        "--reprobe-interval",
        type=float,
        default=reprobe.DEFAULT_INTERVAL,
        metavar="S",
        help="run the probes (and the built-in entries) again every S seconds, give or take 10%%, and report a"
        f" changed result to the controller (health after join; default {reprobe.DEFAULT_INTERVAL:g}, 0 = never)",
    )
    parser.add_argument(
        "--report-host",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="report this machine's ncpus, mem (MiB), type and ngpus (nvidia-smi), which the daemon checks against"
        " the template (default: on; --no-report-host for a process that plays a machine of a nominal size)",
    )
    parser.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="keep the join secret in this 0600 file so that a restarted agent rejoins (read instead of the token"
        " when it exists)",
    )
    parser.add_argument(
        "--imds",
        default="",
        metavar="URL",
        help="read spot interruption and rebalance notices from this instance metadata service (IMDSv2), e.g."
        " http://169.254.169.254 on EC2, and report them to the controller (default: off)",
    )
    parser.add_argument(
        "--imds-interval",
        type=float,
        default=imds.DEFAULT_INTERVAL,
        help=f"seconds between two reads of the notices (default {imds.DEFAULT_INTERVAL:g})",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_log_format_argument(parser, default="text")
    return parser


def _config(args: argparse.Namespace) -> AgentConfig:
    controllers = tuple(parse_address(part) for part in args.controllers.split(",") if part.strip())
    if not controllers:
        raise ConfigError("--controllers needs at least one HOST:PORT")
    if args.address_bound:
        if args.instance_ref or not 0 < len(args.machine_id) <= 256:
            raise ConfigError("--address-bound needs --machine-id (1..256 characters) and no --instance-ref")
    elif not 0 < len(args.instance_ref) <= 256:
        raise ConfigError("--instance-ref must be 1..256 characters")
    if not (0 < args.heartbeat and args.heartbeat * 2 <= args.reply_timeout):
        raise ConfigError("--heartbeat must be positive and at most half of --reply-timeout")
    if args.orphan_timeout is not None and not args.orphan_timeout >= args.reply_timeout:
        raise ConfigError("--orphan-timeout must be at least --reply-timeout")
    if args.on_orphan == "shutdown" and (args.orphan_timeout is None or not shlex.split(args.shutdown_command)):
        raise ConfigError("--on-orphan shutdown needs --orphan-timeout and a non-empty --shutdown-command")
    return AgentConfig(
        controllers,
        args.instance_ref,
        identity=args.identity,
        heartbeat_interval=args.heartbeat,
        reply_timeout=args.reply_timeout,
        orphan_timeout=args.orphan_timeout,
    )


def _probes(args: argparse.Namespace) -> dict[str, str]:
    """``--probe`` as ``{name: command}``; ``ConfigError`` for a bad timeout, too many or a name twice."""
    if not 0 < args.probe_timeout <= 300:
        raise ConfigError("--probe-timeout must be more than 0 and at most 300 seconds")
    if not (args.reprobe_interval == 0 or MIN_REPROBE_INTERVAL <= args.reprobe_interval <= MAX_REPROBE_INTERVAL):
        raise ConfigError(
            f"--reprobe-interval must be 0 (never) or {MIN_REPROBE_INTERVAL:g} to {MAX_REPROBE_INTERVAL:g} seconds"
        )
    try:
        return capabilities.check_probes(args.probe)
    except ValueError as exc:
        raise ConfigError(f"--probe: {exc}") from None


def shut_down(command: str) -> None:
    """Run the shutdown command (no shell), waiting at most ``SHUTDOWN_WAIT``; failures are logged, not raised:
    the agent exits either way."""
    argv = shlex.split(command)
    log.warning("orphaned: running the shutdown command %r", argv[0])
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=SHUTDOWN_WAIT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.error("the shutdown command failed: %s: %s", type(exc).__name__, exc)
        return
    if done.returncode != 0:
        log.error("the shutdown command exited with %d", done.returncode)


def _read_token(args: argparse.Namespace, *, delete: bool = True) -> str:
    if args.token_file is not None:
        return read_token_file(args.token_file, delete=delete)
    token = read_token_stream(sys.stdin.buffer)
    # Nothing else comes on stdin; keep no pipe to whoever started us.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return token


def _save_first(state: StateFile, saved: SavedSecrets) -> None:
    try:
        state.save(saved)
    except OSError as exc:
        why = exc.strerror or exc
        raise ConfigError(f"cannot write {state.source}: {why}; the token file is left in place") from None


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class EarlySignals:
    """Our signals before trio takes over (SIGUSR1's default action would kill the agent).

    While ``exit_on_stop`` (before ``trio.run``: nothing is connected, nothing to clean up), SIGTERM/SIGINT exit at
    once with code 0, even while the agent waits for its token on stdin. Afterwards they are only noted, and
    ``run_agent`` applies them first.
    """

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.exit_on_stop = True
        for signum in SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.exit_on_stop and signum in (signal.SIGTERM, signal.SIGINT):
            os._exit(EXIT_STOPPED)
        self.pending.append(signum)


#: ``--reprobe-interval``'s bounds (besides 0): a probe runs commands, so not a busy loop; and at least daily.
MIN_REPROBE_INTERVAL = 10.0
MAX_REPROBE_INTERVAL = 86400.0


def reprobing(
    args: argparse.Namespace, probes: dict[str, str], joined: dict[str, str], agent: WorkerAgent
) -> reprobe.Reprobe | None:
    """The re-probes ``--reprobe-interval`` asks for, reported through ``agent``; ``None`` when it is 0 or there is
    nothing to measure (no ``--probe`` and ``--no-report-host``)."""
    if args.reprobe_interval == 0 or not (probes or args.report_host):
        return None
    log.info("re-probing every %g s", args.reprobe_interval)
    measure = functools.partial(capabilities.report, probes, args.probe_timeout, host=args.report_host)
    return reprobe.Reprobe(measure, agent.report_capabilities, args.reprobe_interval, joined=joined)


def imds_fetch(args: argparse.Namespace) -> imds.Fetch | None:
    """The metadata service ``--imds`` names (``None``: off). Raises ``ConfigError``."""
    if not args.imds:
        return None
    if not 0.5 <= args.imds_interval <= 300:
        raise ConfigError("--imds-interval must be 0.5 to 300 seconds")
    try:
        return imds.http_fetch(args.imds)
    except ValueError as exc:
        raise ConfigError(f"--imds: {exc}") from None


async def run_agent(
    agent: WorkerAgent,
    early: list[int] | None = None,
    watch: imds.NoticeWatch | None = None,
    again: reprobe.Reprobe | None = None,
) -> int:
    """Run until a stop signal (exit 0) or a final refusal (its exit code). USR1/USR2 switch busy/idle.

    ``early`` holds signals that arrived before this ran (``EarlySignals.pending``); they are applied first.
    ``watch``: the metadata service's notices, polled beside the session (``--imds``). ``again``: the re-probes,
    run beside the session (``--reprobe-interval``).
    """
    exit_code = EXIT_STOPPED
    early = early if early is not None else []
    with trio.open_signal_receiver(*SIGNALS) as receiver:
        async with trio.open_nursery() as nursery:

            async def keep_joined() -> None:
                nonlocal exit_code
                try:
                    await agent.run()
                except (JoinRefused, Orphaned) as exc:
                    log.error("%s", exc)
                    exit_code = exc.exit_code
                nursery.cancel_scope.cancel()

            async def signals() -> AsyncIterator[int]:
                while early:
                    yield early.pop(0)
                async for signum in receiver:
                    yield signum

            nursery.start_soon(keep_joined)
            if watch is not None:
                nursery.start_soon(watch.run)
            if again is not None:
                nursery.start_soon(again.run)
            async for signum in signals():
                if signum in (signal.SIGTERM, signal.SIGINT):
                    log.info("stopping on %s", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
                agent.set_status(HostStatus.BUSY if signum == signal.SIGUSR1 else HostStatus.IDLE)
    return exit_code


def main(argv: list[str]) -> int:
    early = EarlySignals()
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    formatter = configure_logging(
        args.log_level.lower(),
        args.log_format,
        static={"pid": os.getpid()},
        text_format=f"%(asctime)s agent[{os.getpid()}] %(levelname)s %(message)s",
    )
    try:
        config = _config(args)
        probes = _probes(args)
        fetch = imds_fetch(args)
        claim = args.machine_id if args.address_bound else ""
        state = StateFile(args.state_file) if args.state_file is not None else None
        saved = state.load(config.instance_ref, claim) if state is not None else None
        token = "" if saved is not None else _read_token(args, delete=state is None)
        if state is not None and saved is None:
            # Kept on disk before the token file goes: a restart from here on finds the token in the state file.
            saved = Credentials(config.instance_ref, token, claim=claim).snapshot()
            _save_first(state, saved)
            if args.token_file is not None:
                delete_token_file(args.token_file)
        # The join secrets never reach the log, in either format.
        formatter.redact = Redactor().including([token, *(saved.secrets() if saved is not None else [])])
    except ConfigError as exc:
        print(f"provisionerd agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    log.info(
        "starting instance_ref=%r machine_id=%r controllers=%s labels=%s",
        config.instance_ref,
        args.machine_id,
        ",".join(config.controllers),
        dict(args.label),
    )
    # Measured once, before the first join: a machine's hardware does not change while it serves.
    report = capabilities.report(probes, args.probe_timeout, host=args.report_host)
    log.info("capabilities %s", " ".join(f"{k}={v}" for k, v in sorted(report.items())))
    config = attrs.evolve(config, capabilities=report)
    if state is not None:
        log.info("join secret %s %s", "kept in" if token else "restored from", state.source)
    agent = WorkerAgent(config, token, tls_connector(args.certs), claim=claim, saved=saved, state=state)
    del token
    watch = None
    again = reprobing(args, probes, report, agent)
    if fetch is not None:
        log.info("reading reclaim notices from %s every %g s", args.imds, args.imds_interval)
        notify = agent.report_notice
        watch = imds.NoticeWatch(fetch, lambda found: notify(found.reclaim_at, found.rebalance_at), args.imds_interval)
    early.exit_on_stop = False
    code = trio.run(run_agent, agent, early.pending, watch, again)
    if code == EXIT_ORPHANED and args.on_orphan == "shutdown":
        shut_down(args.shutdown_command)
    log.info("exiting with code %d", code)
    return code
