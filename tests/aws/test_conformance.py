"""The daemon's conformance kit (``provisionerd provider check``) against the plugin on the EC2 emulator.

The kit gives the plugin only PATH, HOME and the locale variables of its own environment, exactly like the daemon,
so credentials come the way an operator's would: a shared credentials file under HOME. The persistent transport is
checked here; the one-shot transport runs the same kit in ~15 s of CPU (one Python start per call) and is covered
action by action by the other tests in this folder.
"""

from __future__ import annotations

import json

import pytest
from rigs import procs

pytestmark = pytest.mark.process


@pytest.mark.parametrize("join", ["token", "address-bound"])
def test_conformance_kit_passes_on_the_persistent_transport(plugin, join):
    """Also with batch launches (``join: address-bound``): the kit's refs are ``<op_id>-<i>``, one call per request,
    and every machine's ``provisionerd:instance`` comes from its batch's slot tags."""
    home = plugin.tmp / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = {plugin.secrets[0]}\naws_secret_access_key = {plugin.secrets[1]}\n"
    )
    config = {k: v for k, v in plugin.config.items() if k != "fault_injection"}
    config["templates"] = [{**t, "join": join} for t in config["templates"]]
    (plugin.conf_dir / "aws_ec2.json").write_text(json.dumps(config))
    env = {"PATH": plugin.env["PATH"], "HOME": str(home)}
    argv = procs.provisionerd(
        "provider", "check", "--transport", "persistent", "--json", "--conf-dir", plugin.conf_dir, plugin.plugin_dir
    )
    proc = procs.run_with_env(argv, env=env, timeout=300)
    plugin.outputs += [proc.stdout.decode(), proc.stderr.decode()]
    report = json.loads(proc.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert proc.returncode == 0 and report["failed"] == 0 and not failed, failed
    assert report["passed"] >= 14
    # The plugin declares reclaimsByTags, so the kit also asked getReturnRequests by the cluster's tag (and found
    # every machine wanted back with time left listed under it).
    reclaims = [c for c in report["checks"] if c["name"].startswith("getReturnRequests")]
    assert reclaims and all("reclaimsByTags" in c["detail"] for c in reclaims), reclaims
