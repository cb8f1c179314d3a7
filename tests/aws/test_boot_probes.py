"""The EC2 boot script passes the template's probes to the agent (issue 35, item 1): run as the image would run it
(``test_boot_script``'s harness: AWS's metadata mock serving the user-data the plugin writes, a fake ``shutdown``),
with a fake agent that writes the argv it was started with and exits 0 (the machine "returned": no halt).

- each probe reaches the agent as one argument, ``--probe=NAME=COMMAND``, exactly as configured: spaces, quotes, a
  ``$(...)``, backquotes, a backslash and a glob are never evaluated by the script (the ``$(...)`` would create a
  file), and ``reprobeInterval`` becomes ``--reprobe-interval``;
- what a request's ``userData`` holds, even a ``provisionerd`` or ``probes`` key, reaches no agent argument;
- a user-data whose probe is not one line is no bootstrap: the script halts the instance and starts no agent.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from rigs import imds, procs, wait
from rigs.daemon import make_certs
from test_boot_script import BOOT, REF, boot_env

from provisionerd.agent import capabilities

pytestmark = pytest.mark.integration

from aws_ec2_plugin import bootstrap  # noqa: E402 - on the path through tests/aws/conftest.py


def fake_agent(home: Path) -> tuple[Path, Path]:
    """An executable that writes its argv (as JSON) to the returned file and exits 0."""
    home.mkdir(parents=True, exist_ok=True)
    out = home / "agent-argv.json"
    agent = home / "fake-agent"
    agent.write_text(
        f"#!{sys.executable}\nimport json, sys\nwith open({str(out)!r}, 'w') as f:\n    json.dump(sys.argv[1:], f)\n"
    )
    agent.chmod(0o755)
    return agent, out


def run_boot(tmp_path: Path, document: str) -> tuple[int, Path]:
    """Run the boot script to its end on ``document`` as the user-data; its exit code and the fake agent's argv
    file (absent when no agent started)."""
    certs = make_certs(tmp_path, "c1")
    agent, argv_file = fake_agent(tmp_path / "agent")
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with procs.open_procs() as started:
            mock = await imds.start(started, tmp_path / "imds", user_data=document)
            env = {**boot_env(tmp_path / "machine", mock, certs), "PROVISIONERD_AGENT": str(agent)}
            script = await started.start("boot", [BOOT], tmp_path / "boot.log", env=env)
            await wait.until_sync("the boot script ended", lambda: not script.running(), 30.0, 0.1)
            seen["rc"] = await procs.reap(script)

    trio.run(main)
    return seen["rc"], argv_file


def test_each_probe_reaches_the_agent_as_one_literal_argument_never_evaluated(tmp_path: Path) -> None:
    trap = tmp_path / "evaluated"
    probes = {
        "gputype": "nvidia-smi --query-gpu=name --format=csv,noheader | head -1",
        "odd": f""" echo 'one two'  "three $HOME" $(touch {trap}) `touch {trap}` a\\b * ; exit 0 """,
    }
    passthrough = {"provisionerd": {"probes": {"evil": f"touch {trap}"}}, "probes": {"evil": f"touch {trap}"}}
    boot = {"instanceRef": REF, "controllers": ["127.0.0.1:9"], "joinToken": secrets.token_urlsafe(24)}
    document = bootstrap.user_data(boot, "c1", passthrough, probes, 60.0)

    rc, argv_file = run_boot(tmp_path, document)

    argv = json.loads(argv_file.read_text())
    given = [a for a in argv if a.startswith("--probe")]
    assert given == [f"--probe={name}={command}" for name, command in sorted(probes.items())]
    # The agent takes each as it is: NAME, then the command character for character.
    assert dict(capabilities.parse_probe(a.removeprefix("--probe=")) for a in given) == probes
    assert argv[argv.index("--reprobe-interval") + 1] == "60"
    assert "evil" not in json.dumps(argv)  # the request's userData is never read by the script
    assert not trap.exists()
    assert rc == 0 and not (tmp_path / "machine" / "halted").exists()
    assert "2 probe(s)" in (tmp_path / "boot.log").read_text()
    assert not (tmp_path / "machine" / "state" / "probes").exists()  # read once, then removed


def test_without_probes_the_agent_gets_none(tmp_path: Path) -> None:
    boot = {"instanceRef": REF, "controllers": ["127.0.0.1:9"], "joinToken": secrets.token_urlsafe(24)}
    rc, argv_file = run_boot(tmp_path, bootstrap.user_data(boot, "c1", {"probes": {"x": "true"}}))
    argv = json.loads(argv_file.read_text())
    assert rc == 0 and not any(a.startswith("--probe") or a == "--reprobe-interval" for a in argv)


def test_a_probe_that_is_not_one_line_is_no_bootstrap_and_the_instance_halts(tmp_path: Path) -> None:
    boot = {"instanceRef": REF, "controllers": ["127.0.0.1:9"], "joinToken": secrets.token_urlsafe(24)}
    rc, argv_file = run_boot(tmp_path, bootstrap.user_data(boot, "c1", {}, {"ngpus": "echo 1\necho 2"}))
    assert rc == 1 and (tmp_path / "machine" / "halted").exists() and not argv_file.exists()
    log = (tmp_path / "boot.log").read_text()
    assert "not a provisionerd bootstrap" in log and "the command must be one non-blank line" in log
