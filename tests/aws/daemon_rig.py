"""The pieces of the EC2 end-to-end test (test_daemon_end_to_end.py): the daemon's and the plugin's config, the
machine image stand-in that boots an agent from an instance's user-data, and the processes' start and stop.

The daemon's config is the default one plus the ``aws_ec2`` provider (only what a test run cannot wait for is
shortened: heartbeats, ``idle_time``); the plugin's is the production one with the emulator (or the fault proxy in
front of it) as ``endpoint_url`` and no ``fault_injection``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio
from aws_fakes import ACCESS_KEY, IMAGE, PLUGIN_DIR, REGION, SECRET_KEY, SESSION_TOKEN, user_data

from provisionerd.config.loader import (
    Backoff,
    Config,
    ControllerSettings,
    DaemonSettings,
    LeaseSettings,
    ProviderConfig,
    ProviderTimeouts,
)
from provisionerd.config.writer import provisioner_tls, write_daemon_config
from provisionerd.daemon.admin_socket import query

PROVIDER = "ec2"
#: The two offers, in the daemon's choice order (unpriced offers are taken by template id: offers.py).
OFFERS = (("a-c5-xlarge", "c5.xlarge"), ("b-m5-xlarge", "m5.xlarge"))
IDLE_TIME = 2.0
#: What the plugin puts in each instance's user-data under "provisionerd" (bootstrap.py), with the default
#: ``worker_orphan_timeout`` (0: no orphanTimeout/onOrphan).
BOOT_KEYS = {"version", "instanceRef", "controllers", "joinToken", "cluster"}


def plugin_config(endpoint: str) -> dict[str, Any]:
    """``aws_ec2.json``: two templates of the same shape, one instance type each."""
    templates = [
        {
            "templateId": template_id,
            "instanceType": instance_type,
            "imageId": IMAGE,
            "maxNumber": 10,
            "attributes": {"type": ["String", "X86_64"], "ncpus": ["Numeric", "4"], "mem": ["Numeric", "16384"]},
        }
        for template_id, instance_type in OFFERS
    ]
    return {"region": REGION, "endpoint_url": endpoint, "read_timeout": 20, "templates": templates}


def plugin_env(home: Path) -> dict[str, str]:
    """The provider's ``env``: the fake credentials (the leak check looks for them) and nothing from this host."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def daemon_config(tmp: Path, state: Path, cluster: str, certs: Path, addresses: tuple[str, ...], endpoint: str) -> Path:
    conf, data = tmp / "ec2-conf", tmp / "ec2-data"
    conf.mkdir()
    data.mkdir()
    (conf / "aws_ec2.json").write_text(json.dumps(plugin_config(endpoint)))
    config = Config(
        cluster=cluster,
        identity="prov-ec2-e2e",
        controller=ControllerSettings(
            addresses,
            connect_timeout=3,
            request_timeout=5,
            heartbeat_interval=0.5,
            heartbeat_timeout=5,
            backoff=Backoff(initial=0.1, max=1),
        ),
        tls=provisioner_tls(certs),
        lease=LeaseSettings(margin=0.5),
        daemon=DaemonSettings(events_log=state / "events.jsonl", admin_socket=state / "admin.sock"),
        providers=(
            ProviderConfig(
                PROVIDER,
                "persistent",
                path=PLUGIN_DIR / "provider",
                conf_dir=conf,
                data_dir=data,
                idle_time=IDLE_TIME,
                timeouts=ProviderTimeouts(default=30),
                env=plugin_env(tmp),
            ),
        ),
    )
    write_daemon_config(config, tmp / "pd.toml")
    return tmp / "pd.toml"


# --- the machine image ----------------------------------------------------------------------------------------


def boot_document(ec2: Any, instance_id: str) -> dict[str, Any]:
    """What the image reads from IMDS at boot: the instance's user-data, as the emulator holds it."""
    doc = user_data(ec2, instance_id)
    head = doc["provisionerd"]
    assert set(head) == BOOT_KEYS and head["version"] == 1, sorted(head)  # nothing the boot below would ignore
    return doc


def _write_token(home: Path, token: str) -> Path:
    home.mkdir(mode=0o700)
    path = home / "join-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token)
    return path


async def boot_agent(doc: dict[str, Any], certs: Path, home: Path) -> trio.Process:
    """The image's boot script: ``provisionerd agent`` from the user-data alone (its token, controllers, instance
    ref), with the image's worker certificates. The token goes in a 0600 file the agent deletes once read."""
    head = doc["provisionerd"]
    token_file = _write_token(home, head["joinToken"])
    with (home / "agent.log").open("ab") as log:  # noqa: ASYNC230 - the child's output needs a real file
        return await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "provisionerd",
                "agent",
                "--certs",
                str(certs),
                "--controllers",
                ",".join(head["controllers"]),
                "--instance-ref",
                head["instanceRef"],
                "--token-file",
                str(token_file),
                "--heartbeat",
                "0.5",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


# --- processes and polling ------------------------------------------------------------------------------------


async def daemon_status(sock: Path) -> dict[str, Any] | None:
    try:
        reply = await trio.to_thread.run_sync(query, sock)
    except (OSError, ValueError):
        return None
    return reply["status"] if reply.get("ok") else None


async def wait_for(what: str, probe: Any, limit: float, interval: float = 0.2) -> Any:
    """Poll the async ``probe`` until it returns something truthy (real clock); fail naming ``what``."""
    with trio.move_on_after(limit):
        while True:
            found = await probe()
            if found:
                return found
            await trio.sleep(interval)
    raise AssertionError(f"not within {limit:g} s: {what}")


def terminate(process: trio.Process) -> None:
    """SIGTERM to the process group, once: a second one could land while the first is being handled, after
    Python's finalisation has restored the default action, and kill the process (exit -15, not its own code)."""
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


async def reap(process: trio.Process, grace: float = 10.0) -> int:
    """Wait up to ``grace`` for the exit, then SIGKILL the process group; returns the exit code."""
    with trio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
    return process.returncode


async def stop(process: trio.Process, grace: float = 10.0) -> int:
    """SIGTERM (once), SIGKILL after ``grace``; returns the exit code."""
    terminate(process)
    return await reap(process, grace)
