"""Real processes for the HA tests: replica processes on etcd and ``provisionerd run`` daemons (issue 22).

Imported by the test modules of this folder (``sys.path`` insert, as ``rc_factories``): every process is started
in its own session, and ``stop`` ends it (SIGCONT, SIGTERM, then SIGKILL of its group): the tests stop by themselves.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

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
from refcontroller.admin import AdminClient, AdminError

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = ROOT / "providers" / "simulated"


def make_certs(tmp_path: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> Path:
    from provisionerd.pki.certs import init_certs

    certs = tmp_path / "certs"
    init_certs(certs, "testcluster", hosts=tuple(hosts))
    return certs


def stub_plugin(tmp_path: Path) -> Path:
    """A plugin with no offers (``describeProvider`` fails): the lease is all there is to watch."""
    plugin = tmp_path / "plugins" / "stub"
    plugin.mkdir(parents=True)
    (plugin / "describeProvider.sh").write_text("#!/bin/sh\nexit 1\n")
    (plugin / "describeProvider.sh").chmod(0o755)
    return plugin


def store_url(endpoints: Sequence[str]) -> str:
    return "etcd://" + ",".join(e.removeprefix("http://") for e in endpoints)


async def start_replica(
    certs: Path,
    store: str,
    log: Path,
    *,
    ttl: float,
    check: float,
    listen: str = "127.0.0.1:0",
    prefix: Sequence[str] = (),
) -> tuple[trio.Process, str]:
    """One ``refcontroller serve --store etcd://...`` process (``prefix``: e.g. ``ip netns exec NS``); its address
    once it prints its ready line."""
    argv = [*prefix, sys.executable, "-m", "refcontroller", "serve", "--certs", str(certs), "--store", store]
    argv += ["--listen", listen, "--lease-ttl", str(ttl), "--check-interval", str(check)]
    argv += ["--heartbeat-timeout", "5", "--etcd-lease-ttl", "2"]
    with open(log, "wb") as err:  # noqa: ASYNC230 - the child's stderr needs a real file
        proc = await trio.lowlevel.open_process(argv, stdout=-1, stderr=err, start_new_session=True)
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(30):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            assert chunk, f"replica exited early: see {log}"
            line += chunk
    ready = json.loads(line)
    assert ready["ready"] and ready["store"] == "etcd"
    return proc, ready["listen"][0]


def daemon_config(
    certs: Path,
    addresses: Sequence[str],
    state: Path,
    provider: ProviderConfig,
    *,
    identity: str = "prov-ha",
    heartbeat_timeout: float = 1.5,
) -> Config:
    return Config(
        cluster="testcluster",
        identity=identity,
        controller=ControllerSettings(
            tuple(addresses),
            connect_timeout=2,
            request_timeout=2,
            heartbeat_interval=0.3,
            heartbeat_timeout=heartbeat_timeout,
            backoff=Backoff(initial=0.1, max=0.5),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
        providers=(provider,),
    )


async def start_daemon(config: Config, path: Path, log: Path, prefix: Sequence[str] = ()) -> trio.Process:
    write_daemon_config(config, path)
    with open(log, "wb") as err:  # noqa: ASYNC230 - the child's stderr needs a real file
        return await trio.lowlevel.open_process(
            [*prefix, sys.executable, "-m", "provisionerd", "run", "--config", str(path)],
            start_new_session=True,
            stderr=err,
        )


async def status_of(sock: Path) -> dict | None:
    try:
        reply = await trio.to_thread.run_sync(query, sock)
    except (OSError, ValueError):
        return None
    return reply["status"] if reply and reply.get("ok") else None


async def poll_status(sock: Path, predicate: Callable[[dict], bool], limit: float = 30.0) -> dict:
    with trio.fail_after(limit):
        while True:
            status = await status_of(sock)
            if status is not None and predicate(status):
                return status
            await trio.sleep(0.05)


async def primary_status(admin: AdminClient, limit: float = 20.0) -> dict:
    with trio.fail_after(limit):
        while True:
            try:
                status = await admin.status()
                if status["term"] >= 1:
                    return status
            except (AdminError, OSError):
                pass
            await trio.sleep(0.1)


def held(status: dict) -> bool:
    return status["leases"][0]["state"] == "held"


def events_of(state: Path) -> list[dict]:
    path = state / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def stop(proc: trio.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    with trio.move_on_after(10):
        await proc.wait()
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()


def kill9(proc: trio.Process) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
