"""Real processes: ``refcontroller serve`` killed and restarted on the same store and port, ``provisionerd agent``s.

An agent that joined with its token holds its own credential (and a legacy machine that joined by the address-bound
join, #19, too); after the controller's restart it rejoins with it.
A machine returned before the restart (a ``Returned`` fact) is refused after it: its agent exits with code 3. The
spent token is refused too. Neither the token nor the credential shows in any log.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from agent_procs import alive, wait_for
from ctl_client import Provisioner

from provisionerd.domain.model import Epoch, Fact, InstanceFact, RequestIntent, Returned
from provisionerd.wire.messages import FactAck, FactCommit
from refcontroller.admin import AdminClient

pytestmark = pytest.mark.process

PROVIDER = "local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def controller(certs: Path, data: Path, port: int, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    argv = [
        sys.executable,
        "-m",
        "refcontroller",
        "serve",
        "--certs",
        str(certs),
        "--data",
        str(data),
        "--listen",
        f"127.0.0.1:{port}",
        "--lease-ttl",
        "1",
        "--check-interval",
        "0.5",
        "--heartbeat-timeout",
        "3",
        *extra,
    ]
    with log.open("ab") as sink:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=sink, start_new_session=True)
    try:
        assert process.stdout is not None
        assert b'"ready": true' in process.stdout.readline(), log.read_text()[-2000:]
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def start_agent(
    certs: Path, tmp_path: Path, port: int, ref: str, token: str, log: Path, *how: str
) -> subprocess.Popen[bytes]:
    """``provisionerd agent`` for ``ref`` (or, with ``how``, e.g. ``--address-bound --machine-id M``) reading
    ``token`` from stdin."""
    argv = [
        sys.executable,
        "-m",
        "provisionerd",
        "agent",
        "--certs",
        str(certs),
        "--controllers",
        f"127.0.0.1:{port}",
        *(("--instance-ref", ref) if ref else how),
        "--token-stdin",
        "--heartbeat",
        "0.5",
        "--label",
        f"test-dir={tmp_path}",
    ]
    with log.open("ab") as sink:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=sink, stderr=sink, start_new_session=True)
    assert process.stdin is not None
    process.stdin.write(token.encode())
    process.stdin.close()
    return process


def hosts(certs: Path, port: int) -> dict[str, str]:
    async def read() -> dict[str, str]:
        status = await AdminClient(certs, (f"127.0.0.1:{port}",)).status()
        return {h["instance_ref"]: h["status"] for h in status["hosts"]}

    try:
        return trio.run(read)
    except (OSError, trio.BrokenResourceError, ConnectionError):
        return {}


def commit(certs: Path, port: int, facts: list[Callable[[Epoch], Fact]]) -> None:
    """Join as a provisioner, take the lease (through the grace of a fresh controller) and commit each fact."""

    async def main() -> None:
        provisioner = await Provisioner.join(certs, (f"127.0.0.1:{port}",), PROVIDER)
        try:
            epoch = await provisioner.lease(PROVIDER)
            for fact in facts:
                reply = await provisioner.request(FactCommit(fact(epoch)))
                assert isinstance(reply, FactAck), reply
        finally:
            await provisioner.aclose()

    trio.run(main)


def test_an_agent_rejoins_a_restarted_controller_with_its_credential_and_a_returned_one_is_refused(
    certs: Path, tmp_path: Path
) -> None:
    port, data, ctl_log = free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    refs = ["c1/i-keep", "c1/i-back"]
    tokens = [secrets.token_urlsafe(24) for _ in refs]
    logs = [tmp_path / "keep.log", tmp_path / "back.log"]
    agents: list[subprocess.Popen[bytes]] = []
    try:
        with controller(certs, data, port, ctl_log):
            hashes = [hashlib.sha256(t.encode()).hexdigest() for t in tokens]
            commit(
                certs,
                port,
                [
                    lambda epoch: RequestIntent(PROVIDER, epoch, "op-1", "local-1", 2, tuple(refs), tuple(hashes)),
                    lambda epoch: InstanceFact(PROVIDER, epoch, "op-1", refs[0], "m-0", "local-1", hashes[0]),
                    lambda epoch: InstanceFact(PROVIDER, epoch, "op-1", refs[1], "m-1", "local-1", hashes[1]),
                ],
            )
            agents = [
                start_agent(certs, tmp_path, port, ref, tok, log)
                for ref, tok, log in zip(refs, tokens, logs, strict=True)
            ]
            wait_for(lambda: hosts(certs, port) == {refs[0]: "idle", refs[1]: "idle"}, 60, 0.2, "both agents idle")
            commit(certs, port, [lambda epoch: Returned(PROVIDER, epoch, "ret-1", ("m-1",))])
            # The controller dies (SIGKILL: nothing in memory survives) and comes back on the same store and port.
        with controller(certs, data, port, ctl_log):
            wait_for(lambda: hosts(certs, port).get(refs[0]) == "idle", 60, 0.2, "the kept agent idle again")
            assert wait_for(lambda: agents[1].poll() is not None, 30, 0.1, "the returned machine's agent to exit")
            assert agents[1].returncode == 3, logs[1].read_text()[-2000:]
            assert "join #2" in logs[0].read_text() and alive(agents[0].pid)
            assert refs[1] not in hosts(certs, port)
            # The spent token of the kept machine is refused: a second agent with it exits with code 3.
            thief = start_agent(certs, tmp_path, port, refs[0], tokens[0], tmp_path / "thief.log")
            assert thief.wait(timeout=60) == 3
            assert hosts(certs, port).get(refs[0]) == "idle" and alive(agents[0].pid)
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGTERM)
                try:
                    agent.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(agent.pid, signal.SIGKILL)
                    agent.wait()
    everything = b"".join(p.read_bytes() for p in tmp_path.glob("*.log"))
    assert b"cred-v1:" not in everything
    assert not any(t.encode() in everything for t in tokens)
    refusals = ctl_log.read_text()
    assert "reason=credential_revoked" in refusals and "reason=token_invalid" in refusals


def test_a_legacy_machine_joins_by_address_once_and_rejoins_a_restarted_controller(certs: Path, tmp_path: Path) -> None:
    """#19: no token reaches the machine; it joins as the machine the provider reported at 127.0.0.1, once."""
    port, data, ctl_log = free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    bootstrap = tmp_path / "bootstrap"
    secret = secrets.token_urlsafe(24)
    bootstrap.write_text(secret)
    bootstrap.chmod(0o600)
    option = ("--address-bound-join", str(bootstrap))
    unused = hashlib.sha256(secrets.token_urlsafe(24).encode()).hexdigest()  # the token the plugin never carried
    claim = ("--address-bound", "--machine-id", "i-0abc")
    agent, log = None, tmp_path / "legacy.log"
    try:
        with controller(certs, data, port, ctl_log, *option):
            commit(
                certs,
                port,
                [
                    lambda epoch: RequestIntent(PROVIDER, epoch, "op-1", "local-1", 1, ("c1/i-1",), (unused,)),
                    lambda epoch: InstanceFact(
                        PROVIDER, epoch, "op-1", "c1/i-1", "i-0abc", "local-1", unused, address="127.0.0.1"
                    ),
                ],
            )
            agent = start_agent(certs, tmp_path, port, "", secret, log, *claim)
            wait_for(lambda: hosts(certs, port) == {"c1/i-1": "idle"}, 60, 0.2, "the legacy agent idle")
            # Once: a second claim of the same machine, from the same address, is refused.
            second = start_agent(certs, tmp_path, port, "", secret, tmp_path / "second.log", *claim)
            assert second.wait(timeout=60) == 3
        with controller(certs, data, port, ctl_log, *option):
            wait_for(lambda: hosts(certs, port).get("c1/i-1") == "idle", 60, 0.2, "the legacy agent back")
            assert "join #2" in log.read_text() and alive(agent.pid)
    finally:
        if agent is not None and agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(timeout=10)
    everything = b"".join(p.read_bytes() for p in tmp_path.glob("*.log"))
    assert secret.encode() not in everything and b"cred-v1:" not in everything
    assert "reason=machine_joined" in ctl_log.read_text()
