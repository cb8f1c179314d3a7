"""What is EC2's in the end-to-end test (test_daemon_end_to_end.py): the ``aws_ec2`` provider in the daemon's config,
the plugin's own config, and the machine image stand-in that boots an agent from an instance's user-data. The
daemon's config, its process and the agents' processes are the rig's (``rigs.daemon``, ``rigs.agents``).

The provider is added to the rig's test config (only what a test run cannot wait for is shortened: ``idle_time``);
the plugin's config is the production one with the emulator (or the fault proxy in front of it) as
``endpoint_url`` and no ``fault_injection``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_fakes import IMAGE, PLUGIN_DIR, REGION, credentials_env, user_data
from rigs import agents, procs
from rigs.daemon import as_records

from provisionerd.config.loader import ProviderConfig, ProviderTimeouts

PROVIDER = "ec2"
#: The two offers, in the daemon's choice order (unpriced offers are taken by template id: offers.py).
OFFERS = (("a-c5-xlarge", "c5.xlarge"), ("b-m5-xlarge", "m5.xlarge"))
IDLE_TIME = 2.0
#: What the plugin puts in each instance's user-data under "provisionerd" (bootstrap.py), with the default
#: ``worker_orphan_timeout`` (3600 s: orphanTimeout, and onOrphan "shutdown").
BOOT_KEYS = {"version", "instanceRef", "controllers", "joinToken", "cluster", "orphanTimeout", "onOrphan"}


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


def ec2_provider(home: Path, endpoint: str) -> ProviderConfig:
    """The ``aws_ec2`` provider over its persistent transport, its conf and data directories under ``home``."""
    conf, data = home / "ec2-conf", home / "ec2-data"
    conf.mkdir()
    data.mkdir()
    (conf / "aws_ec2.json").write_text(json.dumps(plugin_config(endpoint)))
    return ProviderConfig(
        PROVIDER,
        "persistent",
        path=PLUGIN_DIR / "provider",
        conf_dir=conf,
        data_dir=data,
        **as_records(dict(idle_time=IDLE_TIME, timeouts=ProviderTimeouts(default=30), env=credentials_env(home))),
    )


# --- the machine image ----------------------------------------------------------------------------------------


def boot_document(ec2: Any, instance_id: str) -> dict[str, Any]:
    """What the image reads from IMDS at boot: the instance's user-data, as the emulator holds it."""
    doc = user_data(ec2, instance_id)
    head = doc["provisionerd"]
    assert set(head) == BOOT_KEYS and head["version"] == 1, sorted(head)  # nothing the boot below would ignore
    return doc


async def boot_agent(started: procs.Procs, doc: dict[str, Any], certs: Path, home: Path) -> procs.Proc:
    """The image's boot script: ``provisionerd agent`` from the user-data alone (its token, controllers, instance
    ref), with the image's worker certificates. The token goes in a 0600 file the agent deletes once read."""
    head = doc["provisionerd"]
    token = agents.token_file(home, head["joinToken"])
    return await agents.boot(started, home, certs, head["controllers"], token, "--instance-ref", head["instanceRef"])
