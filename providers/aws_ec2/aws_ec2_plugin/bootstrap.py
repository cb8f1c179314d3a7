"""What a new instance carries: its tags (public) and its user-data (the bootstrap; a join token only with
``join: token``).

The split is the security boundary. Tags are readable by anyone with ``ec2:DescribeInstances`` and show up in
listings, facts and the console; user-data is readable only with ``ec2:DescribeInstanceAttribute`` and from the
instance itself (IMDS). So the join token goes into user-data only, and tags carry identifiers only.

User-data is one JSON document; the worker agent on the image reads it from IMDS
(``http://169.254.169.254/latest/user-data``):

    {"provisionerd": {"version": 1, "instanceRef", "controllers", "joinToken", "cluster"
                      [, "orphanTimeout", "onOrphan": "shutdown"] [, "probes", "reprobeInterval"]}, "userData": {...}}

where ``userData`` is the request's LSF-style ``userData`` object, passed through untouched. ``orphanTimeout``
(seconds) is there when the daemon sets ``worker_orphan_timeout``: the agent is then started with
``--orphan-timeout`` and ``--on-orphan shutdown``, and since every instance is launched with
``InstanceInitiatedShutdownBehavior=terminate`` its halt terminates the instance. ``probes`` (``{name: shell
command}``) and ``reprobeInterval`` are the template's, from this plugin's config: the boot script passes each probe
to the agent as one ``--probe=NAME=COMMAND`` argument (and ``--reprobe-interval``). They are in the
``provisionerd`` part, which only this module writes; the request's ``userData`` is the other part, which the boot
script never reads, so a request cannot add a probe (a command the machine would run).

With ``join: address-bound`` one RunInstances launches many machines, and user-data, which belongs to the call, is
shared by all of them; so it holds no secret and names no machine:

    {"provisionerd": {"version": 2, "join": "address-bound", "controllers", "cluster"
                      [, "orphanTimeout", "onOrphan": "shutdown"] [, "probes", "reprobeInterval"]}, "userData": {...}}

The machine joins as its EC2 instance id (from IMDS) with the cluster's bootstrap secret from its image, from the
address EC2 reported for it (protocol.md §4 "Address-bound join"); the controller tells it which instance it is.
Its ``instanceRef`` is on the instance as the batch's slot tags (``slots``), read back by :func:`tag_dict`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from aws_ec2_plugin import slots
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


def user_data(
    bootstrap: Mapping[str, Any],
    cluster: str,
    passthrough: Mapping[str, Any],
    probes: Mapping[str, str] | None = None,
    reprobe_interval: float | None = None,
) -> str:
    """The user-data document for one instance; ``probes`` and ``reprobe_interval``: its template's (the config's,
    never the request's). Raises ``invalid_request`` above EC2's 16 KiB limit."""
    head: dict[str, Any] = {
        "version": 1,
        "instanceRef": bootstrap["instanceRef"],
        "controllers": list(bootstrap["controllers"]),
        "joinToken": bootstrap["joinToken"],
        "cluster": cluster,
    }
    return _document(head, bootstrap, passthrough, probes, reprobe_interval)


def shared_user_data(
    bootstrap: Mapping[str, Any],
    cluster: str,
    passthrough: Mapping[str, Any],
    probes: Mapping[str, str] | None = None,
    reprobe_interval: float | None = None,
) -> str:
    """The user-data of a batch launch: what every machine of the call shares (``bootstrap`` is any one of them,
    see :func:`shared_key`), no token and no instance ref. A batch is of one template, so its probes are shared."""
    head = {"version": 2, "join": "address-bound", "controllers": list(bootstrap["controllers"]), "cluster": cluster}
    return _document(head, bootstrap, passthrough, probes, reprobe_interval)


def shared_key(bootstrap: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a bootstrap goes into shared user-data: machines launched by one call must agree on it."""
    return (tuple(bootstrap["controllers"]), bootstrap.get("orphanTimeout"))


def _document(
    head: dict[str, Any],
    bootstrap: Mapping[str, Any],
    passthrough: Mapping[str, Any],
    probes: Mapping[str, str] | None,
    reprobe_interval: float | None,
) -> str:
    if bootstrap.get("orphanTimeout"):
        head.update(orphanTimeout=bootstrap["orphanTimeout"], onOrphan="shutdown")
    if probes:
        head["probes"] = dict(probes)
    if reprobe_interval is not None:
        head["reprobeInterval"] = reprobe_interval
    doc = {"provisionerd": head, "userData": dict(passthrough)}
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_USER_DATA:
        # The size only: the text may hold a token.
        size = len(text.encode())
        raise PluginError("invalid_request", f"user-data would be {size} bytes; EC2 allows {MAX_USER_DATA}")
    return text


def batch_tags(
    owner_tags: Mapping[str, str], prefix: str, group: Sequence[int], template_id: str, extra: Mapping[str, str]
) -> list[dict[str, str]]:
    """The tags every instance of one batch call is created with: the owner tags and the slots (``slots``)."""
    tags = dict(extra)
    tags.update(owner_tags)
    tags[slots.TAG_REF_PREFIX] = prefix
    tags[slots.TAG_SLOTS] = slots.encode(group)
    tags[TAG_TEMPLATE] = template_id
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


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


def batch_client_token(op_id: str, group: Sequence[int], offering: str) -> str:
    """The ClientToken of one batch call: the same op, slots and offering always give the same token."""
    text = f"{op_id}|{slots.encode(group)}|{offering}"
    return "pdb-" + hashlib.sha256(text.encode()).hexdigest()[:57]


def tag_dict(instance: Mapping[str, Any]) -> dict[str, str]:
    """An EC2 instance description's tags as a plain mapping, with ``provisionerd:instance`` for an instance of a
    batch call (from its slot tags and launch index): every reader sees one ref per instance, however launched."""
    tags = {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or ()}
    if TAG_INSTANCE not in tags:
        ref = slots.instance_ref(tags, instance.get("AmiLaunchIndex"))
        if ref is not None:
            tags[TAG_INSTANCE] = ref
    return tags
