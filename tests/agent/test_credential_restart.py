"""Real processes: ``refcontroller serve`` killed and restarted on the same store and port, ``provisionerd agent``s.

An agent that joined with its token holds its own credential (and a legacy machine that joined by the address-bound
join, #19, too); after the controller's restart it rejoins with it.
A machine returned before the restart (a ``Returned`` fact) is refused after it: its agent keeps trying until its
orphan timeout (issue 31 finding 4: a refusal may be "not yet"), then exits with code 3. The spent token is refused
too. Neither the token nor the credential shows in any log.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from subprocess import Popen

import pytest
import trio
from agent_procs import alive
from ctl_client import Provisioner
from rigs import agents, controller, wait

from provisionerd.domain.model import Epoch, Fact, InstanceFact, RequestIntent, Returned
from provisionerd.wire.messages import FactAck, FactCommit
from refcontroller.admin import AdminClient

pytestmark = pytest.mark.process

PROVIDER = "local"


def serve(certs: Path, data: Path, port: int, log: Path, *extra: str) -> AbstractContextManager[controller.Served]:
    """The controller on ``port`` with a 1 s lease ttl and a 3 s heartbeat timeout; SIGKILL at the end."""
    timings = ("--lease-ttl", "1", "--check-interval", "0.5", "--heartbeat-timeout", "3")
    return controller.serving(certs, data, log, *timings, *extra, listen=f"127.0.0.1:{port}")


def start_agent(
    stack: ExitStack, certs: Path, tmp_path: Path, port: int, ref: str, token: str, log: Path, *how: str
) -> Popen[bytes]:
    """``provisionerd agent`` for ``ref`` (or, with ``how``, e.g. ``--address-bound --machine-id M``) reading
    ``token`` from stdin; stopped when ``stack`` closes."""
    argv = agents.agent_argv(
        certs,
        [f"127.0.0.1:{port}"],
        tmp_path,
        *how,
        "--token-stdin",
        *("--heartbeat", "0.5", "--reply-timeout", "5", "--orphan-timeout", "12"),
        ref=ref or None,
    )
    return stack.enter_context(agents.agent(argv, log, token.encode()))


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


def commit_machine(certs: Path, port: int, ref: str, machine_id: str, token_hash: str, address: str = "") -> None:
    """The intent and instance fact of one machine (``address``: where the provider reported it, for an
    address-bound join)."""
    commit(
        certs,
        port,
        [
            lambda epoch: RequestIntent(PROVIDER, epoch, "op-1", "local-1", 1, (ref,), (token_hash,)),
            lambda epoch: InstanceFact(
                PROVIDER, epoch, "op-1", ref, machine_id, "local-1", token_hash, address=address
            ),
        ],
    )


#: A heartbeat timeout long enough that a host is not marked lost while its agent restarts on a loaded machine.
SLOW_LOSS = ("--lease-ttl", "1", "--check-interval", "0.5", "--heartbeat-timeout", "20")


def test_an_agent_rejoins_a_restarted_controller_with_its_credential_and_a_returned_one_is_refused(
    certs: Path, tmp_path: Path
) -> None:
    port, data, ctl_log = wait.free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    refs = ["c1/i-keep", "c1/i-back"]
    tokens = [secrets.token_urlsafe(24) for _ in refs]
    logs = [tmp_path / "keep.log", tmp_path / "back.log"]
    with ExitStack() as stack:
        with serve(certs, data, port, ctl_log):
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
            started = [
                start_agent(stack, certs, tmp_path, port, ref, tok, log)
                for ref, tok, log in zip(refs, tokens, logs, strict=True)
            ]
            wait.blocking("both agents idle", lambda: hosts(certs, port) == {refs[0]: "idle", refs[1]: "idle"}, 60, 0.2)
            commit(certs, port, [lambda epoch: Returned(PROVIDER, epoch, "ret-1", ("m-1",))])
            # The controller dies (SIGKILL: nothing in memory survives) and comes back on the same store and port.
        with serve(certs, data, port, ctl_log):
            wait.blocking("the kept agent idle again", lambda: hosts(certs, port).get(refs[0]) == "idle", 60, 0.2)
            wait.blocking("the returned machine's agent exited", lambda: started[1].poll() is not None, 60)
            assert started[1].returncode == 3, logs[1].read_text()[-2000:]
            assert "join #2" in logs[0].read_text() and alive(started[0].pid)
            assert refs[1] not in hosts(certs, port)
            # The spent token of the kept machine is refused: a second agent with it exits with code 3 (at 12 s).
            thief = start_agent(stack, certs, tmp_path, port, refs[0], tokens[0], tmp_path / "thief.log")
            assert thief.wait(timeout=60) == 3
            assert hosts(certs, port).get(refs[0]) == "idle" and alive(started[0].pid)
    everything = b"".join(p.read_bytes() for p in tmp_path.glob("*.log"))
    assert b"cred-v1:" not in everything
    assert not any(t.encode() in everything for t in tokens)
    refusals = ctl_log.read_text()
    assert "reason=credential_revoked" in refusals and "reason=token_invalid" in refusals


def test_a_legacy_machine_joins_by_address_once_and_rejoins_a_restarted_controller(certs: Path, tmp_path: Path) -> None:
    """#19: no token reaches the machine; it joins as the machine the provider reported at 127.0.0.1, once."""
    port, data, ctl_log = wait.free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    bootstrap = tmp_path / "bootstrap"
    secret = secrets.token_urlsafe(24)
    bootstrap.write_text(secret)
    bootstrap.chmod(0o600)
    option = ("--address-bound-join", str(bootstrap))
    unused = hashlib.sha256(secrets.token_urlsafe(24).encode()).hexdigest()  # the token the plugin never carried
    claim = ("--address-bound", "--machine-id", "i-0abc")
    log = tmp_path / "legacy.log"
    with ExitStack() as stack:
        with serve(certs, data, port, ctl_log, *option):
            commit_machine(certs, port, "c1/i-1", "i-0abc", unused, "127.0.0.1")
            agent = start_agent(stack, certs, tmp_path, port, "", secret, log, *claim)
            wait.blocking("the legacy agent idle", lambda: hosts(certs, port) == {"c1/i-1": "idle"}, 60, 0.2)
            # Once: a second claim of the same machine, from the same address, is refused.
            second = start_agent(stack, certs, tmp_path, port, "", secret, tmp_path / "second.log", *claim)
            assert second.wait(timeout=60) == 3
        with serve(certs, data, port, ctl_log, *option):
            wait.blocking("the legacy agent back", lambda: hosts(certs, port).get("c1/i-1") == "idle", 60, 0.2)
            assert "join #2" in log.read_text() and alive(agent.pid)
    everything = b"".join(p.read_bytes() for p in tmp_path.glob("*.log"))
    assert secret.encode() not in everything and b"cred-v1:" not in everything
    assert "reason=machine_joined" in ctl_log.read_text()


def test_a_machine_booting_before_its_fact_joins_once_the_fact_lands(certs: Path, tmp_path: Path) -> None:
    """Issue 31 finding 4: the machine booted while the daemon was down, so no fact names it yet and the controller
    refuses it (``machine_unknown``). The agent used to exit 3 with its secret deleted; it keeps the secret in
    memory, tries again with a back-off, and joins once the daemon has committed the fact."""
    port, data, ctl_log = wait.free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    bootstrap = tmp_path / "bootstrap"
    secret = secrets.token_urlsafe(24)
    bootstrap.write_text(secret)
    bootstrap.chmod(0o600)
    unused = hashlib.sha256(secrets.token_urlsafe(24).encode()).hexdigest()
    log = tmp_path / "early.log"
    with ExitStack() as stack, serve(certs, data, port, ctl_log, "--address-bound-join", str(bootstrap)):
        agent = start_agent(stack, certs, tmp_path, port, "", secret, log, "--address-bound", "--machine-id", "i-early")
        wait.blocking("a refusal", lambda: log.read_text().count("trying again later") >= 2, 60, 0.2)
        assert agent.poll() is None  # still there, secret in memory
        commit_machine(certs, port, "c1/i-e", "i-early", unused, "127.0.0.1")
        wait.blocking("the early machine idle", lambda: hosts(certs, port) == {"c1/i-e": "idle"}, 60, 0.2)
        assert agent.poll() is None and "join #1" in log.read_text()
    assert "reason=machine_unknown" in ctl_log.read_text()
    assert secret not in log.read_text()


def test_after_controller_amnesia_the_agents_stay_until_an_admin_decides(certs: Path, tmp_path: Path) -> None:
    """Issue 31 finding 4: ``serve --new-incarnation`` forgets every credential. The agents used to exit within
    0.6 s; they keep theirs and keep trying (no orphan timeout: the machines are the admin's to decide on)."""
    port, data, ctl_log = wait.free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    ref, token = "c1/i-a", secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    log = tmp_path / "a.log"
    with ExitStack() as stack:
        with serve(certs, data, port, ctl_log):
            commit(
                certs,
                port,
                [
                    lambda epoch: RequestIntent(PROVIDER, epoch, "op-1", "local-1", 1, (ref,), (digest,)),
                    lambda epoch: InstanceFact(PROVIDER, epoch, "op-1", ref, "m-a", "local-1", digest),
                ],
            )
            argv = agents.agent_argv(
                certs, [f"127.0.0.1:{port}"], tmp_path, "--token-stdin", "--heartbeat", "0.5", ref=ref
            )
            agent = stack.enter_context(agents.agent(argv, log, token.encode()))
            wait.blocking("the agent idle", lambda: hosts(certs, port) == {ref: "idle"}, 60, 0.2)
        with serve(certs, data, port, ctl_log, "--new-incarnation"):
            wait.blocking("refused by the new incarnation", lambda: "trying again later" in log.read_text(), 60, 0.2)
            time.sleep(8)
            assert agent.poll() is None, log.read_text()[-2000:]
            assert log.read_text().count("trying again later") >= 3


def test_an_agent_killed_and_restarted_rejoins_from_its_state_file(certs: Path, tmp_path: Path) -> None:
    """Issue 31 item 7, "agent restarts": the agent is SIGKILLed after its join spent the token, and the machine's
    init system runs the same command line again. The token file is gone and the credential the join was issued
    lived in memory, so it could never join again. With ``--state-file`` it rejoins as the same host before the
    controller marks it lost, and no secret reaches a log."""
    port, data, ctl_log = wait.free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    ref, token = "c1/i-r", secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    home = tmp_path / "machine"
    state = home / "state" / "agent.json"
    with ExitStack() as stack, controller.serving(certs, data, ctl_log, *SLOW_LOSS, listen=f"127.0.0.1:{port}"):
        commit_machine(certs, port, ref, "m-r", digest)
        token_path = agents.token_file(home, token)
        argv = agents.agent_argv(
            certs,
            [f"127.0.0.1:{port}"],
            tmp_path,
            *("--token-file", str(token_path), "--state-file", str(state), "--heartbeat", "0.5"),
            ref=ref,
        )
        first = stack.enter_context(agents.agent(argv, tmp_path / "first.log"))
        wait.blocking("the agent idle", lambda: hosts(certs, port) == {ref: "idle"}, 60, 0.2)
        assert not token_path.exists() and oct(state.stat().st_mode & 0o777) == oct(0o600)
        wait.blocking("the credential kept", lambda: b"cred-v1:" in state.read_bytes(), 30, 0.1)
        first.kill()  # SIGKILL: nothing in its memory survives
        first.wait()
        second = stack.enter_context(agents.agent(argv, tmp_path / "second.log"))
        wait.blocking("the restarted agent joined", lambda: "join #1" in (tmp_path / "second.log").read_text(), 60)
        wait.blocking("the host idle again", lambda: hosts(certs, port) == {ref: "idle"}, 60, 0.2)
        assert second.poll() is None and "restored from agent state file" in (tmp_path / "second.log").read_text()
        assert json.loads(state.read_bytes())["token"] is None  # the spent token is no longer kept
    everything = b"".join(p.read_bytes() for p in tmp_path.glob("*.log"))
    assert token.encode() not in everything and b"cred-v1:" not in everything
    assert "host lost" not in ctl_log.read_text()


def join_and_lose_the_reply(certs: Path, port: int, ref: str, token: str) -> str:
    """A worker's Join with its token whose reply never reaches the agent: the connection closes before the worker
    sends anything after it (a controller killed right after its commit looks the same to the worker). The reply's
    type name."""
    from provisionerd.cli.agent import tls_connector
    from provisionerd.domain.model import Role
    from provisionerd.wire.framing import FramedStream
    from provisionerd.wire.messages import Join

    async def main() -> str:
        stream = await tls_connector(certs)(f"127.0.0.1:{port}")
        framed = FramedStream(stream)
        try:
            await framed.send(Join(role=Role.WORKER, identity=ref, instance_ref=ref, token=token), 1)
            envelope = await framed.receive()
            return type(envelope.msg).__name__ if envelope is not None else "none"
        finally:
            await trio.aclose_forcefully(stream)

    return trio.run(main)


def test_a_token_spent_by_a_join_whose_reply_was_lost_admits_its_worker_once_more(certs: Path, tmp_path: Path) -> None:
    """Issue 31 (bench/restarts: 1 healthy machine returned in 102 restarts): the controller spent the worker's token
    and issued its credential, and the reply never reached the worker. Every later join with the token was refused
    ("already used") and the machine was returned at its join deadline. The credential was never delivered (the
    worker sent nothing after the reply) and no session of it is live, so the token buys a new one; once the worker
    has used its session, the token is spent for good."""
    port, data, ctl_log = wait.free_port(), tmp_path / "ctl", tmp_path / "ctl.log"
    ref, token = "c1/i-lost-reply", secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    log = tmp_path / "agent.log"
    with ExitStack() as stack, controller.serving(certs, data, ctl_log, *SLOW_LOSS, listen=f"127.0.0.1:{port}"):
        commit_machine(certs, port, ref, "m-l", digest)
        assert join_and_lose_the_reply(certs, port, ref, token) == "JoinReply"
        agent = start_agent(stack, certs, tmp_path, port, ref, token, log)
        wait.blocking("the agent idle", lambda: hosts(certs, port) == {ref: "idle"}, 60, 0.2)
        assert agent.poll() is None and "join #1" in log.read_text()
        # Delivered now (the agent reported idle on that session): the token admits nobody else.
        thief = start_agent(stack, certs, tmp_path, port, ref, token, tmp_path / "thief.log")
        assert thief.wait(timeout=60) == 3
        assert hosts(certs, port) == {ref: "idle"} and agent.poll() is None
    assert "credential re-issued" in ctl_log.read_text()
    assert token not in log.read_text() and token not in ctl_log.read_text()
