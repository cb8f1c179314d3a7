"""What one new instance carries: its tags (public) and its user-data (the bootstrap, including the join token).

The split is the security boundary. Tags are readable by anyone with ``ec2:DescribeInstances`` and show up in
listings, facts and the console; user-data is readable only with ``ec2:DescribeInstanceAttribute`` and from the
instance itself (IMDS). So the join token goes into user-data only, and tags carry identifiers only.

User-data is one JSON document; the worker agent on the image reads it from IMDS
(``http://169.254.169.254/latest/user-data``):

    {"provisionerd": {"version": 1, "instanceRef", "controllers", "joinToken", "cluster"
                      [, "orphanTimeout", "onOrphan": "shutdown"]}, "userData": {...}}

where ``userData`` is the request's LSF-style ``userData`` object, passed through untouched. ``orphanTimeout``
(seconds) is there when the daemon sets ``worker_orphan_timeout``: the agent is then started with
``--orphan-timeout`` and ``--on-orphan shutdown``, and since every instance is launched with
``InstanceInitiatedShutdownBehavior=terminate`` its halt terminates the instance.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from aws_ec2_plugin.failures import PluginError

TAG_CLUSTER = "provisionerd:cluster"
TAG_PROVIDER = "provisionerd:provider"
TAG_OP = "provisionerd:op"
TAG_EPOCH = "provisionerd:epoch"
TAG_INSTANCE = "provisionerd:instance"
TAG_TEMPLATE = "provisionerd:template"
#: Set on an instance right before we terminate / stop it: the op_id of that return / stop request. It lets any
#: daemon (also a new lease holder on another host) poll the request and tell our returns from reclaims.
TAG_RETURN_OP = "provisionerd:return-op"
TAG_STOP_OP = "provisionerd:stop-op"

#: EC2 limit on user-data before base64 encoding.
MAX_USER_DATA = 16 * 1024
_MAX_CLIENT_TOKEN = 64


def instance_tags(
    owner_tags: Mapping[str, str], instance_ref: str, template_id: str, extra: Mapping[str, str]
) -> list[dict[str, str]]:
    """The tags one instance is created with, in EC2's ``[{"Key", "Value"}]`` shape."""
    tags = dict(extra)
    tags.update(owner_tags)
    tags[TAG_INSTANCE] = instance_ref
    tags[TAG_TEMPLATE] = template_id
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def user_data(bootstrap: Mapping[str, Any], cluster: str, passthrough: Mapping[str, Any]) -> str:
    """The user-data document for one instance. Raises ``invalid_request`` above EC2's 16 KiB limit."""
    head: dict[str, Any] = {
        "version": 1,
        "instanceRef": bootstrap["instanceRef"],
        "controllers": list(bootstrap["controllers"]),
        "joinToken": bootstrap["joinToken"],
        "cluster": cluster,
    }
    if bootstrap.get("orphanTimeout"):
        head.update(orphanTimeout=bootstrap["orphanTimeout"], onOrphan="shutdown")
    doc = {"provisionerd": head, "userData": dict(passthrough)}
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_USER_DATA:
        # The size only: the text holds the token.
        size = len(text.encode())
        raise PluginError("invalid_request", f"user-data would be {size} bytes; EC2 allows {MAX_USER_DATA}")
    return text


def client_token(op_id: str, index: int) -> str:
    """The RunInstances ClientToken for machine ``index`` of ``op_id``: ``<op_id>.<index>`` when it fits.

    One RunInstances per machine (each machine has its own user-data), so each call needs its own token; the
    same (op_id, index) always gives the same token, so a repeated call is idempotent where EC2 honours tokens.
    Longer ones become a digest, still deterministic and within EC2's 64 ASCII characters.
    """
    token = f"{op_id}.{index}"
    if len(token) <= _MAX_CLIENT_TOKEN and token.isascii():
        return token
    return "pd-" + hashlib.sha256(token.encode()).hexdigest()[:58]


def tag_dict(instance: Mapping[str, Any]) -> dict[str, str]:
    """An EC2 instance description's tags as a plain mapping."""
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or ()}
