"""``refcontroller serve`` and ``refcontroller admin`` as real processes, and the inputs they parse."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
import trio
from rc_client import on_real_clock, tls_peer
from rigs import procs

from provisionerd.config.demand_doc import parse_demand
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import DemandItem, ResourceShape, Role
from provisionerd.wire.messages import DemandPage, Join, JoinReply
from refcontroller import addresses
from refcontroller.api import open_refcontroller_process
from refcontroller.cli import main


def admin_cli(certs: Path, connect: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return procs.run(
        procs.refcontroller("admin", "--certs", certs, "--connect", connect, *args), input=stdin, timeout=60
    )


DEMAND = '[{"demand_id": "gpu", "shape": {"ncpus": 8, "gpus": 1, "gpu_type": "a100"}, "count": 2}]'


@pytest.mark.process
@on_real_clock
async def test_serve_and_admin_cli_end_to_end_and_restart(certs: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with open_refcontroller_process(certs, data, replicas=2, lease_ttl=3.0, check_interval=1.0) as ctl:
        assert len(ctl.addresses) == 2 and all(addresses.parse(a)[1] > 0 for a in ctl.addresses)
        connect = ",".join(reversed(ctl.addresses))  # start at the standby: the CLI follows the redirect
        done = await trio.to_thread.run_sync(lambda: admin_cli(certs, connect, "demand", "--file", "-", stdin=DEMAND))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"changed": True, "seq": 1}
        peer = await tls_peer(certs, ctl.addresses[0], Role.PROVISIONER)
        reply = await peer.request(Join(role=Role.PROVISIONER, identity="d1", providers=("aws",)))
        assert isinstance(reply, JoinReply) and reply.accepted and reply.term == 1
        page = await peer.push()
        expected = DemandItem("gpu", ResourceShape(ncpus=8, gpus=1, gpu_type="a100"), 2)
        assert page == DemandPage(1, 0, 1, (expected,))
        await ctl.set_quorum(False)
        assert await ctl.fail_over() == {"previous": 0, "primary": 1, "term": 2}
        done = await trio.to_thread.run_sync(lambda: admin_cli(certs, connect, "status"))
        status = json.loads(done.stdout)
        assert (status["primary"], status["term"], status["quorum_fresh"]) == (1, 2, False)
        assert status["demand"]["seq"] == 1
    # A restart is an election: a new term; the demand (and its seq) survive.
    async with open_refcontroller_process(certs, data, replicas=2) as ctl:
        status = await ctl.status()
        assert (status["term"], status["primary"], status["demand"]["seq"]) == (3, 0, 1)


def test_cli_refuses_bad_arguments_and_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    serve = ["serve", "--certs", str(tmp_path), "--data", str(tmp_path)]
    assert main([*serve, "--listen", "nohostport"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert main([*serve, "--listen", "127.0.0.1:0"]) == 2  # no certificates in that directory
    assert "cannot load TLS files" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("[{}]"))
    admin = ["admin", "--certs", str(tmp_path), "--connect", "127.0.0.1:1", "demand", "--file", "-"]
    assert main(admin) == 2
    assert "'demand_id' is a required property" in capsys.readouterr().err


def test_demand_document_is_checked_strictly() -> None:
    assert parse_demand(DEMAND)[0].shape.gpu_type == "a100"
    assert not parse_demand(DEMAND)[0].all_or_nothing
    (whole,) = parse_demand('[{"demand_id": "mpi", "shape": {}, "count": 4, "all_or_nothing": true}]')
    assert whole.all_or_nothing and whole.count == 4
    for text, fragment in [
        ('[{"demand_id": "x", "shape": {}, "count": 4, "all_or_nothing": 1}]', "1 is not of type 'boolean'"),
        ('[{"demand_id": "x", "shape": {}, "count": "5"}]', "'5' is not of type 'integer'"),
        ('[{"demand_id": "x", "shape": {}, "count": 5.7}]', "5.7 is not of type 'integer'"),
        ('[{"demand_id": "x", "shape": {"cpus": 1}, "count": 1}]', "Additional properties"),
        ("{", "not JSON"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_demand(text)
        assert fragment in str(info.value)


def test_addresses() -> None:
    assert addresses.parse("[::1]:7000") == ("::1", 7000)
    assert addresses.format("::1", 7000) == "[::1]:7000"
    assert addresses.parse_list("a:1, b:2") == [("a", 1), ("b", 2)]
    for bad in ("a", "a:x", ":1", "a:70000", ""):
        with pytest.raises(ConfigError):
            addresses.parse_list(bad) if bad == "" else addresses.parse(bad)
