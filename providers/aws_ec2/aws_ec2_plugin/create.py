"""``requestMachines``: the machines of an op that do not exist yet, idempotent per op_id even where the API is not.

Two ways to launch, by the template's ``join``:

- ``token`` (the default): one RunInstances per machine. Each machine's join token is in its user-data, and
  user-data belongs to a RunInstances call, shared by every instance it launches. One call per machine also puts
  ``provisionerd:instance`` on the instance at creation.
- ``address-bound``: one RunInstances per group of up to ``launch_batch_size`` machines (``batch``). User-data then
  holds no secret; the machine joins by the controller's address-bound join. Its instance ref is derived from tags
  set at creation and its launch index (``slots``). Requests whose refs are not ``<prefix><index>`` (not the
  daemon's) are launched one call per machine, still without a secret.

Both try the template's offerings in order and move to the next on a capacity refusal (``launch``), and both put
every tag on the instance at creation (TagSpecifications), so no instance ever exists untagged.

Why a lookup first: EC2 honours ClientToken, the emulator does not, and a token alone cannot tell a new lease holder
which machines of an op already exist. So every call first asks DescribeInstances for instances tagged with the
op_id (any state, terminated included: a machine that existed is never created again for the same op) and launches
only the instance refs that are missing. The ClientToken (``<op_id>.<index>``, or a digest of the op, the slots
and the offering of a batch) still guards the gap where an instance exists but is not visible to DescribeInstances
yet.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from aws_ec2_plugin import batch, bootstrap, slots
from aws_ec2_plugin.config import JOIN_ADDRESS_BOUND
from aws_ec2_plugin.ec2ops import Ec2, tag_filters
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.inputs import CreateRequest
from aws_ec2_plugin.launch import Call, launch
from aws_ec2_plugin.offerings import Offering, launch_order
from aws_ec2_plugin.records import Records

log = logging.getLogger(__name__)


def request_machines(ec2: Ec2, records: Records, request: CreateRequest, batch_size: int) -> dict[str, Any]:
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
    refs = [entry["instanceRef"] for entry in request.bootstraps]
    missing = [i for i, ref in enumerate(refs) if ref not in launched]
    offerings = launch_order(request.template)

    prefix = slots.ref_prefix(refs)
    if missing and request.template.join == JOIN_ADDRESS_BOUND and prefix is not None:
        outcome = batch.launch_missing(ec2, request, prefix, missing, offerings, batch_size)
        new, refused, failure = dict(outcome.launched), outcome.refused, outcome.failure
    else:
        new, refused, failure = _one_per_machine(ec2, request, missing, offerings)
    launched.update(new)

    failed = {ref: failure.code for ref in refs if ref not in launched} if failure else {}
    _save(records, request, launched, failed)
    if failure is not None and not launched:
        raise failure
    message = f"{len(new)} launched, {len(launched) - len(new)} already existed"
    if refused:
        message += f"; refused for capacity, tried the next: {'; '.join(refused)}"[:1000]
    if failure is not None:
        message += f"; {len(failed)} of {len(refs)} not launched: {failure.code}: {failure.message}"
    return {"requestId": request.op_id, "message": message}


def _one_per_machine(
    ec2: Ec2, request: CreateRequest, missing: Sequence[int], offerings: Sequence[Offering]
) -> tuple[dict[str, str], tuple[str, ...], PluginError | None]:
    """One RunInstances per missing machine, each with its own user-data (its token with ``join: token``)."""
    cluster = request.owner_tags[bootstrap.TAG_CLUSTER]
    template = request.template
    launched: dict[str, str] = {}
    refused: list[str] = []
    start = 0
    for index in missing:
        entry = request.bootstraps[index]
        if template.join == JOIN_ADDRESS_BOUND:
            data = bootstrap.shared_user_data(
                entry, cluster, request.passthrough, template.probes, template.reprobe_interval
            )
        else:
            data = bootstrap.user_data(entry, cluster, request.passthrough, template.probes, template.reprobe_interval)
        tags = bootstrap.instance_tags(
            request.owner_tags, entry["instanceRef"], template.template_id, template.extra_tags
        )
        token = functools.partial(_client_token, request.op_id, index, offerings[0])
        try:
            done = launch(ec2, template, offerings, start, Call(1, data, tags, token))
        except PluginError as err:
            # The rest would meet the same capacity/quota/limit: stop, report, let the daemon decide.
            return launched, tuple(refused), err
        refused += done.refused
        start = done.offering_index
        launched[entry["instanceRef"]] = done.instances[0]["InstanceId"]
    return launched, tuple(refused), None


def _client_token(op_id: str, index: int, first: Offering, offering: Offering) -> str:
    """``<op_id>.<index>`` on the first offering (as before offerings existed); on another, a token of its own:
    the same token with other parameters would be refused (IdempotentParameterMismatch)."""
    if offering == first:
        return bootstrap.client_token(op_id, index)
    return bootstrap.batch_client_token(op_id, (index,), f"{offering.instance_type}|{offering.subnet_id}")


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
