"""``provisionerd run`` for a test: its config written through the project's config writer with test timings,
the simulated provider's configuration, and the daemon as a process with its admin socket and events log.

Test timings: heartbeats every 0.5 s, a 5 s heartbeat timeout, a lease margin of 0.5 s and back-offs of at most
1 s, so a restart or a failover shows in seconds. Everything else is the daemon's default.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    ProviderConfig,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.admin_socket import query
from rigs import procs, wait

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = ROOT / "providers" / "simulated"


@contextmanager
def short_dir(prefix: str = "pvd-") -> Iterator[Path]:
    """A fresh directory under /tmp, removed at the end: a unix socket's path must stay under ~107 bytes, which a
    pytest ``tmp_path`` may not."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_certs(home: Path, cluster: str = "testcluster", hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> Path:
    """``provisionerd certs init`` into ``home/certs``: CA, controller, provisioner, worker and admin."""
    from provisionerd.pki.certs import init_certs

    certs = home / "certs"
    init_certs(certs, cluster, hosts=tuple(hosts))
    return certs


def link_settings(addresses: Sequence[str], **overrides: Any) -> ControllerSettings:
    """The daemon's controller settings with test timings (``overrides`` replace any of them)."""
    settings: dict[str, Any] = {
        "connect_timeout": 3.0,
        "request_timeout": 5.0,
        "heartbeat_interval": 0.5,
        "heartbeat_timeout": 5.0,
        "backoff": Backoff(initial=0.1, max=1.0),
    }
    settings.update(overrides)
    return ControllerSettings(tuple(addresses), **settings)


def daemon_config(
    certs: Path,
    addresses: Sequence[str],
    state: Path,
    *providers: ProviderConfig,
    cluster: str = "testcluster",
    identity: str = "prov-test",
    margin: float = 0.5,
    link: Mapping[str, Any] | None = None,
    **daemon: Any,
) -> Config:
    """A daemon config with test timings: events log and admin socket in ``state``, the provisioner's certificates
    from ``certs`` (``provisionerd certs init``); ``link`` overrides the controller settings, ``daemon`` the
    ``[daemon]`` table."""
    return Config(
        cluster=cluster,
        identity=identity,
        controller=link_settings(addresses, **(link or {})),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=margin),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock", **daemon),
        providers=tuple(providers),
    )


def as_records(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` of a provider whose machines are records (the simulated plugin, the EC2 emulator's instances,
    the LSF example's), played by agents on this host or in the test's process, which cannot show a template's
    nominal size: its templates are not verified against their reports (``unverified_templates = ["*"]``,
    docs/fleet.md) unless ``options`` say otherwise."""
    return {"unverified_templates": ("*",), **options}


def simulated_provider(
    home: Path,
    name: str = "sim",
    transport: str = "oneshot",
    *,
    sim: Mapping[str, Any] | None = None,
    plugin: Path | None = None,
    **options: Any,
) -> ProviderConfig:
    """The shipped simulated provider with its conf and data directories under ``home``; ``sim`` updates its
    ``simulated.json`` (``delays``, ``templates``, ``faults``), ``options`` the provider's config (``as_records``).
    ``plugin``: another path to run it by (a directory of wrappers around its scripts)."""
    conf, data = home / f"{name}-conf", home / f"{name}-data"
    conf.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    document = json.loads((SIMULATED / "conf" / "simulated.json").read_text())
    document.update(sim or {})
    (conf / "simulated.json").write_text(json.dumps(document))
    path = plugin or (SIMULATED / "provider" if transport == "persistent" else SIMULATED)
    return ProviderConfig(name, transport, path=path, conf_dir=conf, data_dir=data, **as_records(options))


LOCAL = ROOT / "providers" / "local"


def local_provider(
    home: Path,
    certs: Path,
    name: str = "local",
    *,
    machines: int = 8,
    local: Mapping[str, Any] | None = None,
    **options: Any,
) -> ProviderConfig:
    """The shipped local provider (each machine a real ``provisionerd agent`` process) over its persistent
    transport, with its conf and data directories under ``home``; ``local`` updates its ``local.json``."""
    conf, data = home / f"{name}-conf", home / f"{name}-data"
    conf.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    template = {"templateId": "local-1", "maxNumber": machines, "ncpus": 1, "memMb": 512, "ngpus": 0, "type": "auto",
                "price": 0}  # fmt: skip
    document = {"templates": [template], "certsDir": str(certs), "heartbeatSeconds": 1, "replyTimeoutSeconds": 5,
                "killGraceSeconds": 5, "agentCommand": [], **(local or {})}  # fmt: skip
    (conf / "local.json").write_text(json.dumps(document))
    return ProviderConfig(name, "persistent", path=LOCAL / "provider", conf_dir=conf, data_dir=data, **options)


def stub_plugin(home: Path) -> Path:
    """A one-shot plugin that offers nothing (``describeProvider`` fails): for tests of the lease and the link."""
    plugin = home / "plugins" / "stub"
    plugin.mkdir(parents=True, exist_ok=True)
    (plugin / "describeProvider.sh").write_text("#!/bin/sh\nexit 1\n")
    (plugin / "describeProvider.sh").chmod(0o755)
    return plugin


async def admin_status(sock: Path) -> dict[str, Any] | None:
    """The daemon's ``status`` through its admin socket; ``None`` while it does not answer."""
    try:
        reply = await trio.to_thread.run_sync(query, sock)
    except (OSError, ValueError):
        return None
    return reply["status"] if reply and reply.get("ok") else None


def lease_held(status: Mapping[str, Any], provider: int = 0) -> bool:
    return bool(status["leases"][provider]["state"] == "held")


@attrs.define(eq=False)
class Daemon:
    """One daemon config and the ``provisionerd run`` processes started from it (a restart is another start)."""

    config: Config
    path: Path
    logs: Path
    procs: procs.Procs
    proc: procs.Proc | None = None
    starts: int = 0

    @classmethod
    def write(cls, config: Config, path: Path, procs_: procs.Procs) -> Daemon:
        """Write ``config`` to ``path`` (checked by the daemon's loader) for starts through ``procs_``."""
        return cls(write_daemon_config(config, path), path, path.parent, procs_)

    @property
    def sock(self) -> Path:
        assert self.config.daemon.admin_socket is not None
        return self.config.daemon.admin_socket

    @property
    def events_path(self) -> Path:
        assert self.config.daemon.events_log is not None
        return self.config.daemon.events_log

    async def start(self, *extra: str, env: Mapping[str, str] | None = None) -> procs.Proc:
        """Start ``provisionerd run`` (its stderr in ``daemon-N.log`` beside the config)."""
        self.starts += 1
        argv = procs.provisionerd("run", "--config", self.path, *extra)
        self.proc = await self.procs.start(
            f"daemon-{self.starts}", argv, self.logs / f"daemon-{self.starts}.log", env=env
        )
        return self.proc

    def replace(self, config: Config) -> None:
        """Write a new config to the same file (for a reload or the next start)."""
        self.config = write_daemon_config(config, self.path)

    async def status(self) -> dict[str, Any] | None:
        return await admin_status(self.sock)

    async def wait_status(
        self, what: str, predicate: Callable[[dict[str, Any]], bool], limit: float = 30.0
    ) -> dict[str, Any]:
        """The first status for which ``predicate`` holds; fails naming ``what`` (and the daemon's last log lines)."""

        async def probe() -> dict[str, Any] | None:
            status = await self.status()
            return status if status is not None and predicate(status) else None

        try:
            return await wait.until(what, probe, limit)
        except wait.WaitTimeout as exc:
            raise wait.WaitTimeout(f"{exc}\n--- daemon log ---\n{self.proc.tail() if self.proc else ''}") from None

    async def wait_held(self, limit: float = 30.0, provider: int = 0) -> dict[str, Any]:
        return await self.wait_status(
            f"the lease of provider #{provider} held", lambda s: lease_held(s, provider), limit
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The events log's records so far (of ``kind`` only, when given)."""
        try:
            lines = self.events_path.read_text().splitlines()
        except OSError:
            return []
        records = [json.loads(line) for line in lines if line.strip()]
        return [r for r in records if kind is None or r.get("event") == kind]

    async def wait_event(self, kind: str, limit: float = 30.0) -> dict[str, Any]:
        """The first event ``kind`` in the events log."""
        return (await wait.until_sync(f"event {kind!r} in {self.events_path}", lambda: self.events(kind), limit))[0]


#: The fixed head of ``parsed_config``: a cluster, an identity, one controller address and TLS file names that
#: need not exist (the loader does not open them).
CONFIG_HEAD = """
cluster = "{cluster}"
identity = "{identity}"
[controller]
addresses = ["{address}"]
[tls]
ca = "ca.pem"
cert = "provisioner.pem"
key = "provisioner.key"
"""


def parsed_config(
    tmp: Path, tables: str, *, cluster: str = "clu", identity: str = "prov-1", address: str = "ctl0:7400"
) -> Config:
    """``tables`` (TOML, dedented: ``[[providers]]``, ``[cost]``, ...) after a fixed head, parsed by the daemon's
    loader with ``tmp`` as the base of relative paths: for a test of what the loader accepts, refuses or builds
    from a table, where the TOML is the input under test (``daemon_config`` writes a whole config otherwise)."""
    head = CONFIG_HEAD.format(cluster=cluster, identity=identity, address=address)
    return Config.from_toml(head + textwrap.dedent(tables), base_dir=tmp)


def machine_counts(status: Mapping[str, Any] | None, provider: str) -> dict[str, int]:
    """The daemon's count of ``provider``'s machines by state (``booting``, ``idle``, ``returning``, ...) in a
    ``status``; ``{}`` when there is no status."""
    return {} if status is None else dict(status["providers"][provider]["machines"])


def machines_gone(provider: str) -> Callable[[Mapping[str, Any]], bool]:
    """A ``Daemon.wait_status`` predicate: the daemon counts ``provider``'s machines and every count is 0 (each
    machine it had is returned and out of its view)."""

    def gone(status: Mapping[str, Any]) -> bool:
        counts = machine_counts(status, provider)
        return bool(counts) and not any(counts.values())

    return gone


def simulated_machines(provider: ProviderConfig) -> dict[str, Any]:
    """The simulated provider's machines by id as its state file holds them (``{}`` before its first call): what
    its cloud has made, whatever the daemon has heard of it. The file is replaced atomically, never half written."""
    assert provider.data_dir is not None
    try:
        state = json.loads((Path(provider.data_dir) / "state.json").read_text())
    except FileNotFoundError:
        return {}
    return dict(state["machines"])
