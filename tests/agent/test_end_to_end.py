"""Agents started by the local provider join the reference controller with their single-use tokens."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from agent_procs import alive, cmdline
from ctl_client import Provisioner
from local_driver import OneShot, local_conf, plugin_env, request_input, return_input
from rigs import agents, procs, wait
from rigs.agents import live_agents

from refcontroller.api import RefController, open_refcontroller

pytestmark = pytest.mark.process


@attrs.define
class Setup:
    ctl: RefController
    plugin: OneShot
    refs: list[str]
    tokens: list[str]
    machines: list[str]


def agent_of(tmp_path: Path, instance_ref: str) -> int:
    for pid in live_agents(str(tmp_path)):
        argv = cmdline(pid)
        if argv[argv.index("--instance-ref") + 1] == instance_ref:
            return pid
    raise AssertionError(f"no agent for {instance_ref}")


async def wait_hosts(ctl: RefController, predicate: Callable[[dict[str, str]], bool], timeout: float = 60) -> None:
    """Poll the controller's status until ``predicate({instance_ref: status})`` holds."""

    async def hosts() -> dict[str, str] | None:
        found = {h["instance_ref"]: h["status"] for h in (await ctl.status())["hosts"]}
        return found if predicate(found) else None

    await wait.until("the hosts in the controller's status as wanted", hosts, timeout, 0.1)


@asynccontextmanager
async def joined_agents(certs: Path, tmp_path: Path, count: int) -> AsyncIterator[Setup]:
    """A 3-replica controller, a RequestIntent for ``count`` machines, and the local provider's agents, idle."""
    async with open_refcontroller(certs, tmp_path / "ctl", replicas=3, lease_ttl=1.0, check_interval=0.5) as ctl:
        provisioner = await Provisioner.join(certs, ctl.addresses, "local")
        try:
            epoch = await provisioner.lease("local")
            tokens = [secrets.token_urlsafe(24) for _ in range(count)]
            ask = request_input("op-e2e", tokens, list(ctl.addresses))
            refs = [boot["instanceRef"] for boot in ask["bootstrap"]]
            await provisioner.commit_intent("local", epoch, "op-e2e", refs, tokens)  # first the intent, then the call
            plugin = OneShot(plugin_env(tmp_path, local_conf(certs)), tmp_path)
            answer = await trio.to_thread.run_sync(plugin.call, "requestMachines", ask)
            status = await trio.to_thread.run_sync(
                plugin.call, "getRequestStatus", {"requests": [{"requestId": answer["requestId"]}]}
            )
            machines = [m["machineId"] for m in status["requests"][0]["machines"]]
            await wait_hosts(ctl, lambda hosts: all(hosts.get(ref) == "idle" for ref in refs))
            try:
                yield Setup(ctl, plugin, refs, tokens, machines)
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(
                        plugin.call, "requestReturnMachines", return_input("ret-e2e", machines)
                    )
                    await wait.until_sync("every agent gone", lambda: not live_agents(str(tmp_path)), 60, 0.1)
        finally:
            await provisioner.aclose()


#: A refused agent keeps its secret and tries again (issue 31 finding 4) until its orphan timeout: exit code 3.
REFUSED_FOR = ("--heartbeat", "1", "--reply-timeout", "4", "--orphan-timeout", "6")


async def run_agent(certs: Path, tmp_path: Path, addresses: tuple[str, ...], ref: str, token: str) -> Any:
    """An agent for ``ref`` with ``token`` on stdin, run to its end (a refused one after ``REFUSED_FOR``)."""
    argv = agents.agent_argv(certs, addresses, tmp_path, "--token-stdin", *REFUSED_FOR, ref=ref)
    return await trio.to_thread.run_sync(lambda: procs.run(argv, input=token, timeout=60))


def test_agents_join_report_busy_and_a_spent_token_is_refused(certs: Path, tmp_path: Path) -> None:
    async def main() -> None:
        with trio.fail_after(150):
            async with joined_agents(certs, tmp_path, 2) as setup:
                pid = agent_of(tmp_path, setup.refs[0])
                os.kill(pid, signal.SIGUSR1)
                await wait_hosts(
                    setup.ctl, lambda hosts: hosts[setup.refs[0]] == "busy" and hosts[setup.refs[1]] == "idle"
                )
                os.kill(pid, signal.SIGUSR2)
                await wait_hosts(setup.ctl, lambda hosts: hosts[setup.refs[0]] == "idle")

                # The same token again (a second agent for the same instance): refused, tried again for 6 s, exit 3.
                again = await run_agent(certs, tmp_path, setup.ctl.addresses, setup.refs[0], setup.tokens[0])
                assert again.returncode == 3
                assert "token_invalid" in again.stderr and setup.tokens[0] not in again.stderr
                # Another instance's (spent) token: refused too; the first agent is unaffected.
                cross = await run_agent(certs, tmp_path, setup.ctl.addresses, setup.refs[0], setup.tokens[1])
                assert cross.returncode == 3
                assert alive(pid)
                stats = (await setup.ctl.status())["stats"]
                assert stats.get("workers_refused", 0) >= 2
        assert not live_agents(str(tmp_path))

    trio.run(main)


def test_an_agent_rejoins_the_new_primary_after_a_failover(certs: Path, tmp_path: Path) -> None:
    async def main() -> None:
        with trio.fail_after(150):
            async with joined_agents(certs, tmp_path, 1) as setup:
                pid = agent_of(tmp_path, setup.refs[0])
                log = tmp_path / "data" / "logs" / f"{setup.machines[0]}.log"
                await setup.ctl.fail_over()
                await wait.until_sync(
                    "the agent's second join, or its exit", lambda: not alive(pid) or "join #2" in log.read_text(), 60
                )
                assert alive(pid), log.read_text()[-2000:]
                await wait_hosts(setup.ctl, lambda hosts: hosts[setup.refs[0]] == "idle")

    trio.run(main)
