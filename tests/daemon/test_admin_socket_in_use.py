"""The admin socket is never taken from a live daemon (issue 22 item 5): a socket that answers is left alone and the
start is refused (``AdminSocketInUse``, naming the pid); a stale socket file (nothing listens) is replaced."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio

from provisionerd.daemon.admin_socket import AdminSocketInUse, query, refuse_if_in_use, serve_admin_socket


def status_of(identity: str):
    return lambda: {"identity": identity, "process": {"pid": os.getpid(), "instance": f"{identity}-instance"}}


def test_a_second_server_on_a_live_socket_is_refused_and_the_first_keeps_answering(tmp_path: Path) -> None:
    path = tmp_path / "run" / "admin.sock"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, path, status_of("first"))
            with pytest.raises(AdminSocketInUse) as info:
                await serve_admin_socket(path, status_of("second"))
            assert info.value.pid == os.getpid()
            assert "in use by process" in str(info.value) and "'first-instance'" in str(info.value)
            with pytest.raises(AdminSocketInUse):
                await trio.to_thread.run_sync(refuse_if_in_use, path)  # what `provisionerd run` checks first
            reply = await trio.to_thread.run_sync(query, path)
            assert reply["status"]["identity"] == "first"
            nursery.cancel_scope.cancel()
        assert not path.exists()  # the first removed its own socket on exit

    trio.run(main)


def test_a_listener_that_takes_no_lock_is_still_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "run" / "admin.sock"
    path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:  # an older daemon: no lock, never answers
        other.bind(str(path))
        other.listen(1)

        async def main() -> None:
            with pytest.raises(AdminSocketInUse) as info:
                await serve_admin_socket(path, status_of("second"))
            assert info.value.pid == os.getpid()

        trio.run(main)
        assert path.is_socket()


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "run" / "admin.sock"
    path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, then closed without listening: the file stays, nothing answers
    assert path.is_socket()
    refuse_if_in_use(path)  # nothing answers: no refusal

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, path, status_of("new"))
            reply = await trio.to_thread.run_sync(query, path)
            assert reply["status"]["identity"] == "new"
            nursery.cancel_scope.cancel()

    trio.run(main)
