"""The local provider tells a dead agent from one it has just started (``Provider._not_dead``).

Between an agent's fork and its exec, ``/proc/PID/cmdline`` is still the plugin's own, so the scan of running agents
(``procs.scan_agents``) does not see it. A status call in that window used to report the agent as "exited on its
own" and the request as ``complete_with_error`` (seen under load in the demo, the local provider's lifecycle test and
its conformance kit). Now a status reports a machine dead only when the very process started for it (pid and start
time) is gone. What the plugin may signal stays decided by the scan alone (``_alive``: a live process that is not
our agent is never signalled, tests/agent/test_local_provider.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "providers" / "local"))

from localprovider import procs  # noqa: E402
from localprovider.actions import Provider  # noqa: E402


def _record(pid: int) -> dict[str, object]:
    stat = procs.proc_stat(pid)
    assert stat is not None
    return {"machineId": "m-1", "pid": pid, "starttime": stat.starttime}


def test_the_process_started_for_a_machine_is_alive_before_the_scan_sees_it_as_an_agent():
    # this test's own process stands for the child between fork and exec: alive, but no agent's command line
    assert Provider._not_dead(_record(os.getpid()), {})


@pytest.mark.process
def test_a_machine_whose_process_is_gone_is_dead():
    child = subprocess.Popen(["sleep", "5"])
    record = _record(child.pid)
    assert Provider._not_dead(record, {})
    child.kill()
    child.wait()
    assert not Provider._not_dead(record, {})


def test_a_pid_reused_by_another_process_is_not_the_machine_s():
    record = {**_record(os.getpid()), "starttime": _record(os.getpid())["starttime"] + 1}
    assert not Provider._not_dead(record, {})


def test_only_the_scan_decides_what_may_be_signalled():
    assert not Provider._alive(_record(os.getpid()), {})


def test_an_agent_the_scan_found_must_be_the_very_process_started():
    record = _record(os.getpid())
    other = procs.AgentProc(os.getpid() + 1, 1, "m-1", "ref", {})
    assert not Provider._not_dead(record, {"m-1": other})
    same = procs.AgentProc(os.getpid(), record["starttime"], "m-1", "ref", {})  # type: ignore[arg-type]
    assert Provider._not_dead(record, {"m-1": same})


@pytest.mark.process
def test_a_child_an_agent_forked_and_has_not_execd_is_not_the_machine(tmp_path):
    """At import trio runs ``ldconfig -p`` (``ctypes.util.find_library``): until that child execs it shows the agent's
    own command line. The scan used to take the child, the later pid, for the machine, so a status right after a
    request called the agent dead and a return would have signalled the child."""
    data_dir = str(tmp_path)
    code = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(20)\n    os._exit(0)\ntime.sleep(20)\n"
    argv = [sys.executable, "-c", code, "agent", "--machine-id", "m-1", "--instance-ref", "r-1"]
    parent = subprocess.Popen([*argv, "--label", f"{procs.HOME_LABEL}={data_dir}"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(_claimants(data_dir)) < 2:  # the parent and its forked child both name m-1
            assert time.monotonic() < deadline, "the child was never forked"
            time.sleep(0.02)
        found = procs.scan_agents(data_dir)
        assert found["m-1"].pid == parent.pid
        assert Provider._alive(_record(parent.pid), found)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        # The forked child is not ours to wait for: under load it still shows its command line for a moment after
        # the SIGKILL (the leftover-agent guard saw it once in five runs under stress-ng --cpu 2).
        deadline = time.monotonic() + 10
        while _claimants(data_dir) and time.monotonic() < deadline:
            time.sleep(0.02)


def _claimants(data_dir: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().decode(errors="replace").split("\0")
        except (OSError, NotADirectoryError):
            continue
        if procs.parse_agent_argv(argv, data_dir) is not None:
            pids.append(int(name))
    return pids
