"""Local security (issue 16 item 5): modes that do not depend on the umask, the socket directory check, and who
may act through the admin socket (its peer's uid, never a process the daemon started)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs
import pytest
import trio

from provisionerd.cli import run as cli_run
from provisionerd.config.loader import Config
from provisionerd.controller.amnesia import ControllerMemory
from provisionerd.controller.memory_file import StateFile
from provisionerd.daemon.admin_socket import (
    AdminSocketCounts,
    Peer,
    _started_by_us,
    peer_refusal,
    query,
    serve_admin_socket,
)
from provisionerd.domain.errors import InsecurePath
from provisionerd.provider.process import open_group_process
from provisionerd.telemetry.events import EventLog
from provisionerd.telemetry.files import check_private_dir, dir_problem, make_private_dir, open_private

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def small_config(tmp_path: Path, admin_socket: Path) -> Config:
    return Config.from_toml(
        f"""
        cluster = "c"
        identity = "p"
        [controller]
        addresses = ["127.0.0.1:1"]
        [tls]
        ca = "ca.pem"
        cert = "p.pem"
        key = "p.key"
        [daemon]
        admin_socket = "{admin_socket}"
        [[providers]]
        name = "sim"
        transport = "oneshot"
        path = "plugins/sim"
        """,
        base_dir=tmp_path,
    )


@pytest.fixture
def umask_000():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# --- modes ---------------------------------------------------------------------------------------------------------


def test_under_umask_000_every_file_the_daemon_writes_is_0600_in_0700_directories(tmp_path, umask_000):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    events = EventLog(root / "log" / "deep" / "events.jsonl")
    events.emit("daemon_started")
    events.close()
    StateFile(root / "state" / "sub" / "controller.c1.json", "c1").save(ControllerMemory("inc-1", 3, {}))

    async def serve():
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_admin_socket, root / "run" / "pd" / "admin.sock", dict)
            assert mode(root / "run" / "pd" / "admin.sock") == 0o600
            nursery.cancel_scope.cancel()

    trio.run(serve)
    created = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert [str(p) for p in created] == [
        "log",
        "log/deep",
        "log/deep/events.jsonl",
        "run",
        "run/pd",
        "run/pd/admin.sock.lock",  # the lock that keeps a second start off a live socket (0600, kept)
        "state",
        "state/sub",
        "state/sub/controller.c1.json",
    ]
    for path in created:
        assert mode(root / path) == (0o700 if (root / path).is_dir() else 0o600), (path, oct(mode(root / path)))


def test_an_existing_events_log_is_made_0600_and_a_planted_symlink_is_not_followed(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text("")
    log.chmod(0o666)
    EventLog(log).close()
    assert mode(log) == 0o600
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(OSError):
        EventLog(link)


def test_open_private_sets_the_mode_whatever_the_umask(tmp_path):
    for umask in (0o000, 0o077, 0o277):
        old = os.umask(umask)
        try:
            path = tmp_path / f"u{umask:o}" / "f"
            os.close(open_private(path))
        finally:
            os.umask(old)
        assert (mode(path.parent), mode(path)) == (0o700, 0o600), oct(umask)


# --- the socket directory ----------------------------------------------------------------------------------------


def test_dir_problem_decides_the_socket_directory_and_its_ancestors():
    d = stat.S_IFDIR
    assert dir_problem(d | 0o700, 1000, 1000, own=True) is None
    assert dir_problem(d | 0o755, 1000, 1000, own=True) is None  # readable is fine, writable is not
    assert "writable" in dir_problem(d | 0o770, 1000, 1000, own=True)
    assert "writable" in dir_problem(d | 0o777, 1000, 1000, own=True)
    assert "owned by uid 0" in dir_problem(d | 0o700, 0, 1000, own=True)
    assert "not a directory" in dir_problem(stat.S_IFLNK | 0o777, 1000, 1000, own=True)
    assert dir_problem(d | 0o1777, 0, 1000, own=False) is None  # /tmp: sticky
    assert dir_problem(d | 0o755, 0, 1000, own=False) is None
    assert "not sticky" in dir_problem(d | 0o777, 0, 1000, own=False)
    assert "neither" in dir_problem(d | 0o755, 1001, 1000, own=False)


def test_a_socket_directory_others_can_write_refuses_the_start(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InsecurePath, match="writable by group or others"):
        check_private_dir(shared)

    async def serve():
        await serve_admin_socket(shared / "admin.sock", dict)

    with pytest.raises(InsecurePath):
        trio.run(serve)
    assert not (shared / "admin.sock").exists()
    # `provisionerd run` says why and exits 2, before starting anything.
    config = small_config(tmp_path, shared / "admin.sock")
    assert cli_run._refuse_insecure_paths(config) == 2
    assert (
        cli_run._refuse_insecure_paths(
            attrs.evolve(config, daemon=attrs.evolve(config.daemon, admin_socket=tmp_path / "ok" / "a.sock"))
        )
        is None
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_socket_directory_owned_by_another_user_refuses_the_start(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, -1)
    with pytest.raises(InsecurePath, match=f"owned by uid {NOBODY}"):
        check_private_dir(theirs)


def test_make_private_dir_leaves_existing_directories_alone(tmp_path):
    tmp_path.chmod(0o755)
    make_private_dir(tmp_path / "a" / "b")
    assert (mode(tmp_path), mode(tmp_path / "a"), mode(tmp_path / "a" / "b")) == (0o755, 0o700, 0o700)


# --- who may ask -------------------------------------------------------------------------------------------------


def test_peer_refusal_is_a_pure_decision():
    assert peer_refusal(Peer(10, 1000), 1000, started_by_daemon=False) is None
    assert peer_refusal(Peer(10, 0), 1000, started_by_daemon=False) is None  # root
    assert peer_refusal(Peer(10, 1001), 1000, started_by_daemon=False)[0] == "foreign_uid"
    assert peer_refusal(Peer(10, NOBODY), 0, started_by_daemon=False)[0] == "foreign_uid"
    assert peer_refusal(Peer(None, None), 1000, started_by_daemon=False)[0] == "unknown_peer"
    assert peer_refusal(Peer(10, 1000), 1000, started_by_daemon=True)[0] == "daemon_child"
    # The uid decides first: another user's process is refused as such even when the daemon started it.
    assert peer_refusal(Peer(10, 1001), 1000, started_by_daemon=True)[0] == "foreign_uid"


@pytest.mark.process
def test_started_by_us_follows_the_parent_chain():
    assert not _started_by_us(os.getpid())  # the daemon asking itself (tests do)
    assert not _started_by_us(None)
    assert not _started_by_us(1)
    with subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True) as shell:
        assert shell.stdout is not None
        grandchild = int(shell.stdout.readline())
        try:
            assert _started_by_us(shell.pid) and _started_by_us(grandchild)
            assert not _started_by_us(grandchild, me=grandchild + 10_000_000)  # not a descendant of a stranger
        finally:
            os.kill(grandchild, 9)
            shell.wait()


def serving(path: Path, body, counts: AdminSocketCounts):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve_admin_socket(
                    path, lambda: {"up": True}, counts=counts, task_status=task_status
                )
            )
            await body()
            nursery.cancel_scope.cancel()

    trio.run(main)


CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"cmd": "status"}\\n')
print(s.makefile().readline())
"""


@pytest.mark.process
def test_a_plugin_process_cannot_use_the_admin_socket(tmp_path):
    path = tmp_path / "run" / "admin.sock"
    counts = AdminSocketCounts()
    seen = {}

    async def body():
        seen["own"] = await trio.to_thread.run_sync(query, path)  # the daemon's own user, not its child: served
        # A plugin is started like this (a new session, the plugin env); it runs as the daemon's user.
        argv = [sys.executable, "-c", CLIENT, str(path)]
        async with open_group_process(argv, env={"PATH": os.environ.get("PATH", "")}) as proc:
            assert proc.stdout is not None
            out = b""
            while chunk := await proc.stdout.receive_some(4096):
                out += chunk
            await proc.wait()
        seen["plugin"] = json.loads(out)

    serving(path, body, counts)
    assert seen["own"] == {"ok": True, "status": {"up": True}}
    assert seen["plugin"]["ok"] is False and seen["plugin"]["refused"] == "daemon_child", seen
    assert counts.accepted == 1 and counts.refused == {"daemon_child": 1}


def _ask_as(uid: int, path: Path) -> dict:
    """Fork a child that setuid()s to ``uid`` and asks the socket; its reply (or the error) comes back by a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plain syscalls only, then _exit
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    s.connect(str(path))
                    s.sendall(b'{"cmd": "status"}\n')
                    answer = s.makefile().readline()
            except OSError as exc:
                answer = json.dumps({"oserror": type(exc).__name__})
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid() a child to nobody")
def test_a_process_of_another_uid_cannot_use_the_admin_socket():
    # pytest's tmp dirs sit in a 0700 directory: this one is reachable by nobody, up to the socket's directory.
    top = Path(tempfile.mkdtemp(prefix="pd-peer-", dir="/tmp"))
    top.chmod(0o755)
    try:
        seen, counts = _ask_as_nobody(top / "run" / "admin.sock")
    finally:
        shutil.rmtree(top)
    assert seen["closed"] == {"oserror": "PermissionError"}
    assert seen["loosened"]["ok"] is False and seen["loosened"]["refused"] == "foreign_uid", seen
    assert f"uid {NOBODY} may not use this socket" in seen["loosened"]["error"]
    assert counts.refused == {"foreign_uid": 1} and counts.accepted == 0


def _ask_as_nobody(path: Path):
    counts = AdminSocketCounts()
    seen = {}

    async def body():
        seen["closed"] = await trio.to_thread.run_sync(_ask_as, NOBODY, path)  # the 0700 directory stops it
        # Even with the file modes loosened (a mistake, or a future one), the peer check refuses it.
        os.chmod(path.parent, 0o755)
        os.chmod(path, 0o666)
        seen["loosened"] = await trio.to_thread.run_sync(_ask_as, NOBODY, path)

    serving(path, body, counts)
    return seen, counts


def test_a_plugin_environment_names_no_admin_socket(tmp_path, monkeypatch):
    from provisionerd.daemon.clients import runtime_config

    sock = tmp_path / "run" / "admin.sock"
    monkeypatch.setenv("PROVISIONERD_ADMIN_SOCKET", str(sock))  # even if the daemon's own environment names it
    config = small_config(tmp_path, sock)
    env = runtime_config(config, config.providers[0]).plugin_env()
    assert not [k for k, v in env.items() if str(sock.parent) in v or "ADMIN" in k], env
