"""The shipped EC2 boot script (``providers/aws_ec2/boot/provisionerd-boot``; issue 34, item 5, "Done when"), run
as the image would run it, against AWS's own metadata mock serving the bootstrap the aws_ec2 plugin writes
(bootstrap.user_data, IMDSv2 only) and a fake ``shutdown`` first on the PATH (it notes its arguments and when):

- no controller reachable (the bootstrap names a closed loopback port): the agent gives up after the orphan
  timeout (exit 5) and the script halts the "instance" within the orphan timeout of its start;
- a reference controller reachable (``refcontroller serve`` on loopback, the machine's intent committed with its
  token's hash): the agent joins as the bootstrap's instance; a SIGTERM to the script stops it without a halt.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from aws_fakes import PLUGIN_DIR
from rigs import imds, procs, wait
from rigs.daemon import make_certs

pytestmark = pytest.mark.integration

BOOT = PLUGIN_DIR / "boot" / "provisionerd-boot"
ORPHAN = 20.0  # the bootstrap's orphanTimeout (at least the agent's 15 s reply timeout)
REF = "c1/i-boot-0001"

from aws_ec2_plugin import bootstrap  # noqa: E402 - on the path through tests/aws/conftest.py


def fake_shutdown(home: Path) -> Path:
    """A ``shutdown`` that writes its arguments and the time to ``home/halted`` and exits 0."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "shutdown"
    script.write_text(f'#!/bin/sh\necho "$(date +%s.%N) $*" >> {home / "halted"}\n')
    script.chmod(0o755)
    return bin_dir


def boot_env(home: Path, mock: imds.Imds, certs: Path) -> dict[str, str]:
    provisionerd = Path(sys.executable).parent / "provisionerd"
    return {
        "PATH": f"{fake_shutdown(home)}{os.pathsep}{os.environ['PATH']}",
        "PROVISIONERD_IMDS": mock.url,
        "PROVISIONERD_AGENT": str(provisionerd),
        "PROVISIONERD_PYTHON": sys.executable,
        "PROVISIONERD_CERTS": str(certs),
        "PROVISIONERD_STATE_DIR": str(home / "state"),
    }


def user_data(controllers: list[str], token: str) -> str:
    boot = {"instanceRef": REF, "controllers": controllers, "joinToken": token, "orphanTimeout": ORPHAN}
    return bootstrap.user_data(boot, "c1", {})


def closed_port() -> int:
    return imds.free_port()  # bound, then closed: nothing listens there


def no_secret_written(home: Path, token: str) -> None:
    """The token is nowhere but in the agent's own 0600 state file (what a restarted agent joins with)."""
    for path in home.rglob("*"):
        if path.name == "agent-state":
            assert path.stat().st_mode & 0o777 == 0o600
        elif path.is_file():
            assert token not in path.read_text(errors="replace"), path


def test_with_no_controller_reachable_the_boot_script_halts_the_instance_within_the_orphan_timeout(
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path, "c1")
    token = secrets.token_urlsafe(24)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with procs.open_procs() as started:
            mock = await imds.start(
                started, tmp_path / "imds", user_data=user_data([f"127.0.0.1:{closed_port()}"], token)
            )
            begun = time.time()
            script = await started.start(
                "boot", [BOOT], tmp_path / "boot.log", env=boot_env(tmp_path / "machine", mock, certs)
            )
            halted = tmp_path / "machine" / "halted"
            await wait.until_sync("the fake shutdown ran", halted.exists, ORPHAN + 30, 0.2)
            seen["halted_after"] = float(halted.read_text().split()[0]) - begun
            seen["halt_args"] = halted.read_text().split()[1:]
            seen["rc"] = await procs.reap(script)

    trio.run(main)
    print(f"\nno controller: halted {seen['halted_after']:.2f} s after boot (orphan timeout {ORPHAN:g} s)")
    assert seen["halt_args"] == ["-h", "now"]
    assert ORPHAN - 5 <= seen["halted_after"] <= ORPHAN
    assert seen["rc"] == 1  # the script ends after the halt
    log = (tmp_path / "boot.log").read_text()
    assert "exit 5" in log and "halting the instance" in log
    no_secret_written(tmp_path, token)


def test_with_a_controller_reachable_the_agent_joins_and_a_stop_is_no_halt(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
    from ctl_client import Provisioner  # tests/agent's minimal provisioner

    from refcontroller.api import open_refcontroller_process

    certs = make_certs(tmp_path, "c1")
    token = secrets.token_urlsafe(24)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with (
            open_refcontroller_process(certs, tmp_path / "ctl", replicas=1, lease_ttl=5.0, check_interval=0.5) as ctl,
            procs.open_procs() as started,
        ):
            provisioner = await Provisioner.join(certs, ctl.addresses, "aws")
            epoch = await provisioner.lease("aws")
            await provisioner.commit_intent("aws", epoch, "op-boot", [REF], [token])
            mock = await imds.start(started, tmp_path / "imds", user_data=user_data(list(ctl.addresses), token))
            begun = time.time()
            script = await started.start(
                "boot", [BOOT], tmp_path / "boot.log", env=boot_env(tmp_path / "machine", mock, certs)
            )

            async def joined() -> dict[str, Any] | None:
                hosts = [h for h in (await ctl.status())["hosts"] if h["instance_ref"] == REF]
                return hosts[0] if hosts and hosts[0]["status"] in ("joined", "idle") else None

            seen["host"] = await wait.until("the boot script's agent joined", joined, 30.0, 0.2)
            seen["joined_after"] = time.time() - begun
            script.terminate()
            seen["rc"] = await procs.reap(script)
            await provisioner.aclose()

    trio.run(main)
    print(f"\ncontroller reachable: joined {seen['joined_after']:.2f} s after boot")
    assert seen["host"]["provider"] == "aws"
    assert seen["rc"] == 0 and not (tmp_path / "machine" / "halted").exists()
    argv_log = (tmp_path / "boot.log").read_text()
    assert "bootstrap v1 read from" in argv_log
    assert not (tmp_path / "machine" / "state" / "join-token").exists()  # the agent deleted it once read
    no_secret_written(tmp_path, token)  # the boot log, the agent log, the controller log and store too
    assert json.loads((tmp_path / "machine" / "state" / "agent-state").read_text())  # kept for a restart
