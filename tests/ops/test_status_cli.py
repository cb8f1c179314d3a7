"""``provisionerd status`` for scripts and pipes (issue 32 item 8): its exit status says whether the daemon is
ready, an old link error is not shown once the link is back, and a closed pipe ends it without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio

from provisionerd.cli.closed_pipe import CLOSED_PIPE
from provisionerd.cli.status import NOT_READY, main, render
from provisionerd.daemon.admin_socket import serve_admin_socket


def document(*, ready: bool, link_state: str = "up", last_error: str = "") -> dict:
    return {
        "cluster": "c",
        "identity": "p",
        "link": {"state": link_state, "primary": "ctl0:1", "term": 1, "generation": 2, "last_error": last_error},
        "ready": {"ok": ready, "reasons": [] if ready else ["no provider lease"]},
    }


def status_exit(tmp_path, doc: dict, *args: str) -> int:
    sock = tmp_path / "a" / "admin.sock"
    codes: list[int] = []

    async def run():
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, sock, lambda: doc)
            codes.append(await trio.to_thread.run_sync(main, ["--socket", str(sock), *args]))
            nursery.cancel_scope.cancel()

    trio.run(run)
    return codes[0]


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_status_exits_0_when_ready_and_3_when_not(tmp_path, capsys, args):
    assert status_exit(tmp_path, document(ready=True), *args) == 0
    assert status_exit(tmp_path, document(ready=False), *args) == NOT_READY == 3
    if not args:
        assert "ready: no (no provider lease)" in capsys.readouterr().out


def test_the_help_names_the_exit_statuses(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 the daemon answered and is ready; 3 it answered but is not ready" in text


def test_a_link_error_is_shown_while_the_link_is_down_and_not_once_it_is_back():
    down = render(document(ready=False, link_state="down", last_error="ctl0:1: OSError: refused"))
    up = render(document(ready=True, link_state="up", last_error="ctl0:1: OSError: refused"))
    assert "last link error: ctl0:1: OSError: refused" in down
    assert not any("last link error" in line for line in up)


@pytest.mark.process
def test_a_closed_pipe_ends_the_command_without_a_traceback():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write, as after `| head -1` has read its line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "provisionerd", "--help"], stdout=write, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write)
    assert done.stderr.decode() == ""
    assert done.returncode == CLOSED_PIPE == 141
