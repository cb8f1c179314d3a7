"""A one-shot call's result outlives its caller (issue 19 item 1): a real "daemon" process runs a call and is killed
with SIGKILL mid-call; a new transport over the same call directories collects what the call left.

Real processes and the real clock throughout (the wrapper is not our child after the kill: only time tells).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from provisionerd.domain.errors import ProviderTimeout
from provisionerd.provider.calls import CallDir, process_starttime
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import ProviderConfig

pytestmark = pytest.mark.process

DAEMON = """
import sys, trio
from provisionerd.provider.oneshot import OneShotProvider
from provisionerd.provider.runtime import ProviderConfig
config = ProviderConfig(name="p", cluster="c", path=sys.argv[1], calls_dir=sys.argv[2],
                        timeouts={"requestMachines": float(sys.argv[3])})
trio.run(lambda: OneShotProvider(config).run_document("requestMachines", {"op_id": "op-1"}, key="k-1"))
"""


def plugin(h, root: Path, seconds: float) -> Path:
    """requestMachines: records its pid, says it made a machine, sleeps, then answers."""
    root.mkdir()
    h.write_executable(
        root / "requestMachines.sh",
        f'#!/bin/sh\necho $$ > "{root}/plugin.pid"\ntouch "{root}/made"\necho "making" >&2\n'
        f'sleep {seconds}\necho \'{{"requestId": "req-7"}}\'\n',
    )
    return root


def config(path: Path, calls: Path, timeout: float = 30.0) -> ProviderConfig:
    return ProviderConfig(
        name="p", cluster="c", path=str(path), calls_dir=str(calls), timeouts={"requestMachines": timeout}
    )


def run_and_kill(path: Path, calls: Path, timeout: float) -> None:
    """Start a 'daemon' making one call and SIGKILL it once the plugin has made its machine."""
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, str(path), str(calls), str(timeout)])
    deadline = time.monotonic() + 30
    while not (path / "made").exists():
        assert daemon.poll() is None and time.monotonic() < deadline, "the call never started"
        time.sleep(0.02)
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()


def entries(calls: Path) -> list[str]:
    return [p.name for p in calls.iterdir() if not p.name.startswith(".")]


def test_a_call_that_finished_while_its_daemon_was_dead_is_collected(tmp_path, h):
    path, calls = plugin(h, tmp_path / "plugin", 0.5), tmp_path / "calls"
    run_and_kill(path, calls, 30)
    (name,) = entries(calls)
    deadline = time.monotonic() + 20
    while not (calls / name / "status").exists():  # the call runs on without its daemon
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for item in [calls, calls / name, *(calls / name).iterdir()]:
        want = 0o700 if item.is_dir() else 0o600
        assert stat.S_IMODE(item.stat().st_mode) == want, item
    transport = OneShotProvider(config(path, calls))
    assert transport.pending_ops() == set()
    (done,) = transport.take_finished()
    assert (done.action, done.op, done.key, done.document) == ("requestMachines", "op-1", "k-1", {"requestId": "req-7"})
    assert entries(calls) == []  # collected: removed
    assert transport.take_finished() == []


def test_a_call_still_running_is_waited_for(tmp_path, h):
    path, calls = plugin(h, tmp_path / "plugin", 2.0), tmp_path / "calls"
    run_and_kill(path, calls, 30)
    transport = OneShotProvider(config(path, calls))
    assert transport.pending_ops() == {"op-1"}
    assert transport.take_finished() == []  # still running: not collected, not lost

    async def main():
        start = trio.current_time()
        found = await transport.take_op("op-1")
        return found, trio.current_time() - start

    (done,), waited = trio.run(main)
    assert done.document == {"requestId": "req-7"} and done.error is None
    assert 0.5 < waited < 10
    assert entries(calls) == []


def test_a_call_still_running_at_its_deadline_is_killed_and_timed_out(tmp_path, h):
    path, calls = plugin(h, tmp_path / "plugin", 60), tmp_path / "calls"
    run_and_kill(path, calls, 2.0)
    pid = int((path / "plugin.pid").read_text())
    transport = OneShotProvider(config(path, calls, 2.0))
    (done,) = trio.run(transport.take_op, "op-1")
    assert isinstance(done.error, ProviderTimeout)
    assert "making" in str(done.error)  # the stderr tail is quoted
    deadline = time.monotonic() + 10
    while not h.is_dead(pid):
        assert time.monotonic() < deadline, "the plugin outlived its deadline"
        time.sleep(0.05)


def test_a_reused_pid_is_not_taken_for_the_call(tmp_path):
    call = CallDir(tmp_path)
    me = os.getpid()
    (tmp_path / "pid").write_text(f'{{"pid": {me}, "starttime": {process_starttime(me)}}}')
    assert call.running()
    (tmp_path / "pid").write_text(f'{{"pid": {me}, "starttime": {(process_starttime(me) or 0) + 1}}}')
    assert not call.running()  # same pid, another start time: not our wrapper


def test_a_second_process_never_touches_the_owners_calls(tmp_path, h):
    path, calls = plugin(h, tmp_path / "plugin", 0), tmp_path / "calls"
    owner = OneShotProvider(config(path, calls))
    other = OneShotProvider(config(path, calls))  # `provisionerd orphans` next to a running daemon
    assert owner.calls.owned and not other.calls.owned
    (calls / "0000000000000-leftover").mkdir()
    (calls / "0000000000000-leftover" / "call.json").write_text('{"action": "requestMachines", "deadline": 0}')
    assert other.take_finished() == [] and entries(calls) == ["0000000000000-leftover"]
    out = trio.run(lambda: other.run_document("requestMachines", {"op_id": "op-2"}))
    assert out == {"requestId": "req-7"} and entries(calls) == ["0000000000000-leftover"]


def test_a_call_about_the_same_op_waits_for_the_leftover(tmp_path, h):
    """The daemon's recovery lists the op after a restart: the listing must not run before the request left by the
    dead daemon has ended (it would miss the machines that request is still making)."""
    path, calls = plugin(h, tmp_path / "plugin", 1.5), tmp_path / "calls"
    h.write_executable(
        path / "listMachines.sh",
        f'#!/bin/sh\nls "{calls}" > "{path}/seen-by-listing"\necho \'{{"machines": []}}\'\n',
    )
    run_and_kill(path, calls, 30)
    transport = OneShotProvider(config(path, calls))
    tags = {"provisionerd:cluster": "c", "provisionerd:op": "op-1"}
    assert trio.run(lambda: transport.call("listMachines", {"tags": tags})) == {"machines": []}
    # When the listing ran, the leftover had been collected (its directory gone): it waited for it. (A read runs
    # in a temporary directory of its own, not under the call root.)
    assert (path / "seen-by-listing").read_text().split() == []
    assert entries(calls) == []
