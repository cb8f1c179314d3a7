"""``requestMachines``: one RunInstances per machine, idempotent per op_id even where the API is not.

Why one call per machine: each machine has its own bootstrap (instance ref, join token), and user-data is per
RunInstances call, shared by every instance it launches. One call per machine also puts ``provisionerd:instance``
on the instance atomically at creation (TagSpecifications), so there is no window where an instance exists without
its full tag set, as there would be with RunInstances(count=n) followed by CreateTags.

Why a lookup first: EC2 honours ClientToken, the emulator does not, and a token alone cannot tell a new lease holder
which machines of an op already exist. So every call first asks DescribeInstances for instances tagged with the
op_id (any state, terminated included: a machine that existed is never created again for the same op) and launches
only the instance refs that are missing. The ClientToken (``<op_id>.<index>``) still guards the gap where an instance
exists but is not visible to DescribeInstances yet.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aws_ec2_plugin import bootstrap
from aws_ec2_plugin.config import Template
from aws_ec2_plugin.ec2ops import Ec2, tag_filters
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.inputs import CreateRequest
from aws_ec2_plugin.records import Records

log = logging.getLogger(__name__)


def request_machines(ec2: Ec2, records: Records, request: CreateRequest) -> dict[str, Any]:
    """Launch the machines of ``request`` that do not exist yet. Returns ``{"requestId": op_id, "message"}``.

    Raises the mapped :class:`PluginError` only when no machine of the op exists at all; once some exist the
    request is accepted (they must be polled and accounted for) and the shortfall is reported in the message and,
    through the record, as ``complete_with_error`` by ``getRequestStatus``.
    """
    cluster = request.owner_tags[bootstrap.TAG_CLUSTER]
    existing = ec2.describe(tag_filters({bootstrap.TAG_OP: request.op_id, bootstrap.TAG_CLUSTER: cluster}))
    launched: dict[str, str] = {}
    for instance in existing:
        ref = bootstrap.tag_dict(instance).get(bootstrap.TAG_INSTANCE)
        if ref:
            launched[ref] = instance["InstanceId"]
    previous = records.load(request.op_id) or {}
    launched = {**previous.get("launched", {}), **launched}

    failure: PluginError | None = None
    new = 0
    for index, entry in enumerate(request.bootstraps):
        ref = entry["instanceRef"]
        if ref in launched:
            continue
        params = _run_params(request, request.template, index, entry)
        try:
            instance = ec2.run_instance(params)
        except PluginError as err:
            failure = err  # the rest would meet the same capacity/quota/limit: stop, report, let the daemon decide
            break
        launched[ref] = instance["InstanceId"]
        new += 1

    refs = [entry["instanceRef"] for entry in request.bootstraps]
    failed = {ref: failure.code for ref in refs if ref not in launched} if failure else {}
    _save(records, request, launched, failed)
    if failure is not None and not launched:
        raise failure
    message = f"{new} launched, {len(launched) - new} already existed"
    if failure is not None:
        message += f"; {len(failed)} of {len(refs)} not launched: {failure.code}: {failure.message}"
    return {"requestId": request.op_id, "message": message}


def _run_params(request: CreateRequest, template: Template, index: int, entry: Any) -> dict[str, Any]:
    cluster = request.owner_tags[bootstrap.TAG_CLUSTER]
    tags = bootstrap.instance_tags(request.owner_tags, entry["instanceRef"], template.template_id, template.extra_tags)
    params: dict[str, Any] = {
        "ImageId": template.image_id,
        "InstanceType": template.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": bootstrap.client_token(request.op_id, index),
        "UserData": bootstrap.user_data(entry, cluster, request.passthrough),
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        # IMDSv2 only: user-data holds a join token, and v2's session token defeats simple SSRF reads of it.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        # An instance that halts itself is gone, not stopped (a stopped one still holds its volumes and counts
        # against limits, and nobody would start it again): the agent halts the machine when it has reached no
        # controller for the orphan timeout (user-data ``orphanTimeout``/``onOrphan``), so even a machine whose
        # daemon and controllers are all gone ends by itself.
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    if template.subnet_id:
        params["SubnetId"] = template.subnet_id
    if template.security_group_ids:
        params["SecurityGroupIds"] = list(template.security_group_ids)
    if template.key_name:
        params["KeyName"] = template.key_name
    if template.instance_profile_arn:
        params["IamInstanceProfile"] = {"Arn": template.instance_profile_arn}
    if template.market == "spot":
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return params


def _save(records: Records, request: CreateRequest, launched: dict[str, str], failed: dict[str, str]) -> None:
    record = {
        "kind": "create",
        "refs": [entry["instanceRef"] for entry in request.bootstraps],
        "launched": launched,
        "failed": failed,
        # Unseen launched machines get visibility_grace from the last launch, which happened in this call.
        "updated": time.time(),
    }
    try:
        records.save(request.op_id, record)
    except OSError as exc:
        # A hint, not the truth (the tags are): losing it costs status detail only.
        log.warning("cannot write the request record for %s: %s", request.op_id, exc.strerror)
