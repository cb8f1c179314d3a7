"""``provisionerd agent`` as a real process: where the token may come from, and where it must never show."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from agent_procs import alive, catches, cmdline, environ
from rigs import agents, wait

pytestmark = pytest.mark.process

TOKEN = "SeCrEt-join-token-0123456789abcdef"


def agent_argv(certs: Path, tmp_path: Path, *source: str) -> list[str]:
    """An agent for ``c1/i-proc`` that reaches no controller (nothing listens on port 9)."""
    return agents.agent_argv(certs, ["127.0.0.1:9"], tmp_path, *source, ref="c1/i-proc")


@contextmanager
def running(
    tmp_path: Path, argv: list[str], stdin: bytes | None = None, close_stdin: bool = True
) -> Iterator[subprocess.Popen[bytes]]:
    """The agent, its output in ``tmp_path/agent.log`` (``log(tmp_path)``)."""
    with agents.agent(argv, tmp_path / "agent.log", stdin, close_stdin=close_stdin, env={"AGENT_TEST": "1"}) as proc:
        yield proc


def log(tmp_path: Path) -> str:
    return (tmp_path / "agent.log").read_text()


def test_a_token_file_readable_by_others_is_refused(certs: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)
    with running(tmp_path, agent_argv(certs, tmp_path, "--token-file", str(token_file))) as agent:
        assert agent.wait(timeout=60) == 2
        err = log(tmp_path)
    assert "0644" in err and TOKEN not in err
    assert token_file.read_text() == TOKEN  # left in place for the operator to see


def test_there_is_no_way_to_pass_the_token_as_an_argument(certs: Path, tmp_path: Path) -> None:
    for flags in (["--token", TOKEN], ["--token-stdin", "--token-file", "x"], []):
        with running(tmp_path, agent_argv(certs, tmp_path, *flags)) as agent:
            assert agent.wait(timeout=60) == 2


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_the_token_is_in_neither_argv_nor_environment_and_sigterm_stops_it(
    certs: Path, tmp_path: Path, source: str
) -> None:
    token_file = tmp_path / "token"
    if source == "file":
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, TOKEN.encode())
        os.close(fd)
        argv, stdin = agent_argv(certs, tmp_path, "--token-file", str(token_file)), None
    else:
        argv, stdin = agent_argv(certs, tmp_path, "--token-stdin"), TOKEN.encode() + b"\n"
    with running(tmp_path, argv, stdin) as agent:
        # The token has been read once the file is gone / stdin is swapped for /dev/null (it then retries port 9).
        if source == "file":
            wait.blocking("the token file deleted", lambda: not token_file.exists(), 60, 0.05)
        else:
            wait.blocking(
                "stdin swapped for /dev/null", lambda: os.readlink(f"/proc/{agent.pid}/fd/0") == os.devnull, 60, 0.05
            )
        # Under load the token is read before the first log line is written: signals wait for it (seen once in
        # five runs under stress-ng --cpu 2: SIGTERM came first and the log was empty).
        wait.blocking("the agent's start logged", lambda: "starting instance_ref=" in log(tmp_path), 60, 0.05)
        assert alive(agent.pid)
        assert TOKEN not in "\0".join(cmdline(agent.pid))
        assert TOKEN.encode() not in environ(agent.pid)
        agent.send_signal(signal.SIGUSR1)  # busy/idle signals do not stop it
        agent.send_signal(signal.SIGUSR2)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    text = log(tmp_path)
    assert "starting instance_ref='c1/i-proc'" in text and TOKEN not in text


def test_sigterm_while_waiting_for_the_token_on_stdin_stops_it(certs: Path, tmp_path: Path) -> None:
    with running(tmp_path, agent_argv(certs, tmp_path, "--token-stdin"), close_stdin=False) as agent:
        wait.blocking("the agent's SIGTERM handler", lambda: catches(agent.pid, signal.SIGTERM), 60, 0.05)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0


def test_an_agent_that_reaches_no_controller_exits_after_the_orphan_timeout_and_shuts_down(
    certs: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "shut-down"
    argv = agent_argv(certs, tmp_path, "--token-stdin", "--heartbeat", "0.5", "--reply-timeout", "1")
    argv += ["--orphan-timeout", "2", "--on-orphan", "shutdown", "--shutdown-command", f"touch {marker}"]
    started = time.monotonic()
    with running(tmp_path, argv, TOKEN.encode() + b"\n") as agent:
        assert agent.wait(timeout=60) == 5
        took = time.monotonic() - started
    text = log(tmp_path)
    assert 2.0 <= took < 30, took  # the timeout counts from the agent's start, not from its first join
    assert marker.exists() and "no controller reached for 2.0 s" in text and TOKEN not in text


def test_without_an_orphan_timeout_the_agent_keeps_trying(certs: Path, tmp_path: Path) -> None:
    argv = agent_argv(certs, tmp_path, "--token-stdin", "--heartbeat", "0.5", "--reply-timeout", "1")
    with running(tmp_path, argv, TOKEN.encode() + b"\n") as agent:
        with pytest.raises(subprocess.TimeoutExpired):
            agent.wait(timeout=4)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0


def test_an_orphan_timeout_below_the_reply_timeout_is_refused(certs: Path, tmp_path: Path) -> None:
    argv = agent_argv(certs, tmp_path, "--token-stdin", "--orphan-timeout", "3")  # reply timeout 15
    with running(tmp_path, argv, TOKEN.encode() + b"\n") as agent:
        assert agent.wait(timeout=60) == 2
