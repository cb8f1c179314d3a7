"""The ``refcontroller`` command.

    refcontroller serve --certs DIR (--data DIR --listen ADDR[,ADDR...] | --store etcd://HOST:PORT[,...] --listen ADDR)
                        [--etcd-lease-ttl S]
                        [--lease-ttl S] [--check-interval S] [--heartbeat-timeout S] [--max-frame BYTES]
                        [--handshake-timeout S] [--join-timeout S] [--max-connections N]
                        [--max-connections-per-address N] [--max-authenticated-per-address N]
                        [--max-buffered-bytes BYTES]
                        [--log-level LEVEL] [--new-incarnation] [--address-bound-join FILE]
    refcontroller admin --certs DIR --connect ADDR[,ADDR...] [--timeout S] COMMAND
        demand (--file PATH | --clear)     PATH is a JSON array of demand items ('-' = stdin)
        failover [--target N]              default: the next replica
        quorum {lost,restored}
        status
    refcontroller history --data DIR --provider NAME [--after INDEX] [--limit N]

``serve --store etcd://...`` runs **one** replica (``refcontroller.serve_etcd``) on an etcd cluster: run one process per
replica, each with its own ``--listen`` address; they elect their primary through etcd, and the ready line has
``"store": "etcd"``. Without ``--store``, the embedded SQLite store in ``--data``:
``serve`` runs one replica per ``--listen`` address (port 0 = any free port) and, once every listener is up,
prints one JSON line on stdout: ``{"ready": true, "listen": ["127.0.0.1:41234", ...], "term": N, "incarnation":
"..."}``. It logs to stderr and stops cleanly on SIGTERM or SIGINT. ``admin`` prints the controller's JSON answer on
stdout.

``history`` prints one page of a provider's audit log, read from the store in ``--data`` without writing to it
(safe beside a running ``serve``): ``{"facts": [{"index": I, "ended_at": E, "committed_at": T, "fact": {...}}, ...],
"next_after": I}``, oldest first, at most ``--limit`` (500, at most 10,000) facts after ``--after``; ``ended_at`` is
0 for a fact still in the resync set, else the index of the fact that ended its lifecycle (docs/protocol.md §6.3);
``committed_at`` is when the controller committed it (epoch seconds; 0 when not known: committed before commit
times were kept); ``next_after`` is ``null`` on the last page.

The bounds (docs/protocol.md §2.1): ``--handshake-timeout`` (10 s) for the TLS handshake, ``--join-timeout`` (10 s)
from the handshake to a complete Join frame, ``--max-connections`` (2000) open at once (over it a new connection is
closed before TLS), ``--max-connections-per-address`` (200) unauthenticated from one IP address (over it the oldest
of those is closed for the new one), ``--max-authenticated-per-address`` (2000) from one IP address past a valid
certificate, ``--max-buffered-bytes`` (256 MiB) received but not yet processed across all connections (a connection
that would pass it is dropped). Every refusal is logged and counted in ``admin status`` under ``gate.refusals``.

``serve`` refuses to start on a store that is damaged, lost, or behind its mark (a zero-length file, a mark without
its file, a lost write-ahead log: see ``refcontroller.store``), with one line on stderr and exit code 2: starting
on it would make a controller that forgot what it acknowledged. ``--new-incarnation`` sets whatever is in
``--data`` aside (renamed ``*.discarded-<unix time>``) and starts a new incarnation on purpose; daemons that knew
the old one stop their mutations until their admin accepts the reset (``provisionerd controller accept-reset``).

Exit codes: 0 success, 1 the controller refused or could not be reached, 2 bad arguments or input, or a store
refused.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TextIO

import trio

from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import DemandItem, Fact
from refcontroller import addresses as addr
from refcontroller import allocator, gate
from refcontroller.admin import AdminClient, AdminError
from refcontroller.credentials_address import AddressBoundJoin
from refcontroller.gate import Limits
from refcontroller.jsonconv import unstructure
from refcontroller.listeners import FACTS_FILE, ServeConfig, serve
from refcontroller.server import Timeouts
from refcontroller.store import StoreRefused, read_history


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refcontroller", description="the reference cluster controller")
    commands = parser.add_subparsers(dest="command", required=True)

    s = commands.add_parser("serve", help="run the replicas")
    s.add_argument("--certs", required=True, type=Path, help="directory made by 'provisionerd certs init'")
    s.add_argument("--data", type=Path, help="directory of the durable fact log (the embedded SQLite store)")
    s.add_argument("--store", help="etcd://HOST:PORT[,HOST:PORT...]: this process is one replica on that etcd")
    s.add_argument("--etcd-lease-ttl", type=_count, default=2, help="the primary's claim on etcd expires after (2 s)")
    s.add_argument("--listen", required=True, help="HOST:PORT per replica, comma-separated (port 0 = any)")
    s.add_argument("--lease-ttl", type=_positive, default=30.0, help="lease TTL in seconds (default 30)")
    s.add_argument("--check-interval", type=_positive, default=5.0, help="quorum check interval T_check (5)")
    s.add_argument("--heartbeat-timeout", type=_positive, default=15.0, help="drop silent peers after (15)")
    s.add_argument("--max-frame", type=int, default=1 << 20, help="largest frame body in bytes (1 MiB)")
    s.add_argument("--handshake-timeout", type=_positive, default=10.0, help="TLS handshake within (10)")
    s.add_argument("--join-timeout", type=_positive, default=10.0, help="first frame within, after TLS (10)")
    s.add_argument("--max-connections", type=_count, default=gate.DEFAULT_MAX_CONNECTIONS, help="open at once (2000)")
    s.add_argument(
        "--max-connections-per-address", type=_count, default=gate.DEFAULT_MAX_PER_ADDRESS, help="from one IP (200)"
    )
    s.add_argument(
        "--max-authenticated-per-address",
        type=_count,
        default=gate.DEFAULT_MAX_CONNECTIONS,
        help="from one IP, past a valid certificate: their own budget (2000)",
    )
    s.add_argument(
        "--max-buffered-bytes", type=_count, default=gate.DEFAULT_MAX_BUFFERED_BYTES, help="all connections (256 MiB)"
    )
    s.add_argument("--log-level", default="INFO")
    s.add_argument(
        "--address-bound-join",
        type=Path,
        metavar="FILE",
        help="admit workers of legacy plugins by machine id and address, with the bootstrap secret in FILE (0600)",
    )
    s.add_argument(
        "--new-incarnation",
        action="store_true",
        help="set aside the store in --data and start a new incarnation (daemons must accept the reset)",
    )

    a = commands.add_parser("admin", help="talk to a running controller with the admin certificate")
    a.add_argument("--certs", required=True, type=Path)
    a.add_argument("--connect", required=True, help="HOST:PORT of any replica, comma-separated")
    a.add_argument("--timeout", type=_positive, default=10.0)
    ops = a.add_subparsers(dest="op", required=True)
    d = ops.add_parser("demand", help="replace the demand")
    source = d.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", help="JSON array of demand items ('-' = stdin)")
    source.add_argument("--clear", action="store_true", help="set zero demand")
    f = ops.add_parser("failover", help="promote another replica in a new term")
    f.add_argument("--target", type=int, default=None, help="replica index (default: the next one)")
    q = ops.add_parser("quorum", help="simulate losing or regaining the quorum")
    q.add_argument("state", choices=["lost", "restored"])
    ops.add_parser("status", help="replicas, term, leases, demand, facts, hosts")

    h = commands.add_parser("history", help="a page of a provider's fact log, ended lifecycles included")
    h.add_argument("--data", required=True, type=Path, help="directory of the durable fact log")
    h.add_argument("--provider", required=True)
    h.add_argument("--after", type=int, default=0, help="the last index of the previous page (0: from the start)")
    h.add_argument("--limit", type=_count, default=500, help="facts per page (500, at most 10000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if argv is None and args.command == "serve":  # a command line, not a test calling main in-process
        allocator.serve_with_malloc(sys.argv[1:])
    try:
        try:
            if args.command == "history":
                return _history(args)
            return _serve(args) if args.command == "serve" else _admin(args)
        except BaseExceptionGroup as group:  # trio wraps what a nursery raised; show the one cause plainly
            raise _only_cause(group) from None
    except (ConfigError, StoreRefused) as exc:
        print(f"refcontroller: {exc}", file=sys.stderr)
        return 2
    except (AdminError, OSError) as exc:
        print(f"refcontroller: {exc}", file=sys.stderr)
        return 1


def _only_cause(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    listen = tuple(addr.format(*a) for a in addr.parse_list(args.listen))
    if args.max_frame < 64 * 1024:
        raise ConfigError(f"--max-frame must be at least 65536 bytes, not {args.max_frame}")
    if (args.data is None) == (args.store is None):
        raise ConfigError("serve needs exactly one of --data DIR (embedded store) and --store etcd://...")
    if args.store is not None and len(listen) != 1:
        raise ConfigError("--store etcd://... runs one replica: give one --listen address (run one process each)")
    config = ServeConfig(
        certs_dir=args.certs,
        data_dir=args.data or Path(),
        listen=listen,
        lease_ttl=args.lease_ttl,
        check_interval=args.check_interval,
        timeouts=Timeouts(
            heartbeat=args.heartbeat_timeout,
            send=args.heartbeat_timeout,
            handshake=args.handshake_timeout,
            join=args.join_timeout,
        ),
        max_frame=args.max_frame,
        limits=Limits(
            max_connections=args.max_connections,
            max_per_address=args.max_connections_per_address,
            max_authenticated_per_address=args.max_authenticated_per_address,
            max_buffered_bytes=args.max_buffered_bytes,
        ),
        new_incarnation=args.new_incarnation,
        address_bound=None if args.address_bound_join is None else AddressBoundJoin.from_file(args.address_bound_join),
    )
    if args.store is None:
        trio.run(_serve_until_signalled, functools.partial(serve, config), {})
        return 0
    # The etcd store's client (httpx) is the ``etcd`` extra: the embedded SQLite store, the demo's, needs none of it.
    try:
        from refcontroller.serve_etcd import EtcdServeConfig, serve_etcd
        from refcontroller.store_etcd_client import parse_store_url
    except ImportError as exc:
        raise ConfigError(f"--store etcd:// needs the etcd extra (pip install 'provisionerd[etcd]'): {exc}") from None
    try:
        endpoints = parse_store_url(args.store)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    etcd = EtcdServeConfig(config, endpoints, etcd_lease_ttl=args.etcd_lease_ttl)
    extra: dict[str, object] = {"store": "etcd"}
    trio.run(_serve_until_signalled, functools.partial(serve_etcd, etcd), extra)
    return 0


def announce(ready: dict[str, object], stream: TextIO | None = None) -> None:
    """Write the ready line in one write: ``print`` writes the text and its newline apart (unbuffered, as under
    PYTHONUNBUFFERED), and a log line from another thread could land between them on the same line of a file both
    streams append to (seen under load: the ready line then no longer read as JSON, and the start looked hung)."""
    out = sys.stdout if stream is None else stream
    out.write(json.dumps(ready) + "\n")
    out.flush()


def settle_startup_heap() -> None:
    """Collect, then freeze what the started controller holds (modules, the schema, the store, the server): the
    collector never walks it again. A full collection during a resync of 100,000 facts walked it for 20-30 ms of
    CPU (70-90 ms on a loaded machine) in which no heartbeat was answered. Only a serving process does this (it is
    process-wide): in-process tests and embedders keep their collector as it was."""
    gc.collect()
    gc.freeze()


async def _serve_until_signalled(run: Callable[..., Awaitable[object]], extra: dict[str, object]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(run)
            settle_startup_heap()
            cluster = running.server.cluster
            ready = {
                "ready": True,
                "listen": list(running.addresses),
                "term": cluster.term,
                "incarnation": cluster.store.incarnation,
                **extra,
            }
            announce(ready)
            async for signum in signals:
                logging.getLogger("refcontroller").info("stopping on signal %s", signum)
                nursery.cancel_scope.cancel()
                break


def _admin(args: argparse.Namespace) -> int:
    addresses = [addr.format(*a) for a in addr.parse_list(args.connect)]
    items: tuple[DemandItem, ...] = ()
    if args.op == "demand" and not args.clear:  # check the input before touching certificates or the network
        # Imported here: its schema brings jsonschema, which a serving replica (started far more often) never needs.
        from provisionerd.config.demand_doc import parse_demand

        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the demand file: {exc}") from exc
        items = parse_demand(text, "stdin" if args.file == "-" else args.file)
    client = AdminClient(args.certs, addresses, timeout=args.timeout)
    if args.op == "demand":
        result = trio.run(client.set_demand, items)
    elif args.op == "failover":
        result = trio.run(client.fail_over, args.target)
    elif args.op == "quorum":
        result = trio.run(client.set_quorum, args.state == "restored")
    else:
        result = trio.run(client.status)
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def _history(args: argparse.Namespace) -> int:
    limit = min(args.limit, 10_000)
    page = read_history(args.data / FACTS_FILE, args.provider, max(0, args.after), limit)
    facts = [
        {
            "index": row.index,
            "ended_at": row.ended_at,
            "committed_at": row.committed_at,
            "fact": unstructure(row.fact, Fact),
        }
        for row in page
    ]
    next_after = page[-1].index if len(page) == limit else None
    print(json.dumps({"facts": facts, "next_after": next_after}, sort_keys=True))
    return 0
