"""``serve``: the reference controller on real sockets, one mutual-TLS listener per replica, in one process.

Replica ``i`` listens on ``listen[i]``; redirects name the address a replica actually listens on (so listen on an
address clients can reach, not ``0.0.0.0``). The fact log is ``<data_dir>/facts.sqlite`` (and its mark,
``facts.sqlite.mark``), the directory made 0700 and the files 0600 whatever the umask (as the daemon's own,
``telemetry.files``; a directory that exists is left as it is); a store that is damaged, lost or behind its mark
is refused (``store.StoreRefused``) before anything listens, unless ``new_incarnation`` sets it aside and starts
afresh. Starting is an election: the term grows by one (see ``replicas.py``), replica 0 is the primary, and its
grace period starts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from provisionerd.telemetry.files import make_private_dir
from provisionerd.wire.framing import DEFAULT_MAX_FRAME
from provisionerd.wire.tls import server_ssl_context
from refcontroller import addresses as addr
from refcontroller.cluster import Cluster
from refcontroller.credentials_address import AddressBoundJoin
from refcontroller.gate import Gate, Limits, return_memory
from refcontroller.server import ControllerServer, Timeouts, open_controller_server
from refcontroller.store import FactStore

log = logging.getLogger(__name__)

FACTS_FILE = "facts.sqlite"


@attrs.frozen
class ServeConfig:
    certs_dir: Path
    data_dir: Path
    listen: tuple[str, ...]  # one HOST:PORT per replica; port 0 picks a free port
    lease_ttl: float = 30.0
    check_interval: float = 5.0
    timeouts: Timeouts = Timeouts()
    max_frame: int = DEFAULT_MAX_FRAME
    limits: Limits = Limits()
    #: Set aside whatever store is in ``data_dir`` and start a new incarnation (``refcontroller serve
    #: --new-incarnation``): the explicit way to start afresh after a store was lost or damaged.
    new_incarnation: bool = False
    #: The opt-in address-bound join (``--address-bound-join FILE``, ``credentials_address``); ``None``: off.
    address_bound: AddressBoundJoin | None = None


@attrs.frozen
class Running:
    """What ``serve`` hands to ``nursery.start``: the actual addresses (one per replica) and the server."""

    addresses: tuple[str, ...]
    server: ControllerServer


async def open_replica_listeners(
    listen: Sequence[str], certs_dir: Path
) -> tuple[list[list[trio.SSLListener[trio.SocketStream]]], list[str]]:
    """Open a TLS listener (or one per resolved address of a host name) for each replica."""
    context = server_ssl_context(certs_dir, "controller")
    per_replica: list[list[trio.SSLListener[trio.SocketStream]]] = []
    actual: list[str] = []
    try:
        for text in listen:
            host, port = addr.parse(text)
            listeners = await trio.open_ssl_over_tcp_listeners(port, context, host=host)
            per_replica.append(listeners)
            transport = listeners[0].transport_listener
            # trio types it as any Listener; open_ssl_over_tcp_listeners wraps SocketListeners
            assert isinstance(transport, trio.SocketListener), transport
            sockname = transport.socket.getsockname()
            actual.append(addr.format(host, sockname[1]))
    except BaseException:
        await _close_all(per_replica)
        raise
    return per_replica, actual


async def _close_all(per_replica: list[list[trio.SSLListener[trio.SocketStream]]]) -> None:
    with trio.CancelScope(shield=True):
        for listeners in per_replica:
            for listener in listeners:
                await listener.aclose()


async def serve(config: ServeConfig, *, task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the controller until cancelled. ``await nursery.start(serve, config)`` returns a ``Running``."""
    make_private_dir(config.data_dir)  # 0700 whatever the umask (an existing directory is left as it is)
    store = FactStore.open(config.data_dir / FACTS_FILE, new_incarnation=config.new_incarnation)
    try:
        per_replica, actual = await open_replica_listeners(config.listen, config.certs_dir)
        try:
            cluster = Cluster.open(store, len(actual), config.lease_ttl, config.check_interval, trio.current_time())
            cluster.replicas.addresses = list(actual)
            log.info(
                "controller incarnation=%s term=%s primary=0 listen=%s",
                store.incarnation,
                cluster.term,
                ",".join(actual),
            )
            options = {
                "timeouts": config.timeouts,
                "max_frame": config.max_frame,
                "gate": Gate(config.limits),
                "address_bound": config.address_bound,
            }
            async with open_controller_server(cluster, **options) as server, trio.open_nursery() as nursery:
                nursery.start_soon(return_memory, server.gate)
                for replica, listeners in enumerate(per_replica):
                    handler = functools.partial(server.handle_stream, replica=replica)
                    nursery.start_soon(trio.serve_listeners, handler, listeners)
                task_status.started(Running(tuple(actual), server))
        finally:
            await _close_all(per_replica)
    finally:
        store.close()
