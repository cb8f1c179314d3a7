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

**All or nothing** (``allOrNothing: true``, declared in ``describeProvider``): a call that falls short (some
launched, then every offering refused, or any other failure) terminates the instances *this call* launched and
answers the failure (``capacity_unavailable``, ``quota_exceeded``, ...), so nothing of the request is left running.
Instances of the op from an earlier call are never terminated here: after a complete success nothing is missing, so
a replay launches nothing and answers the same request. Since a machine that existed is never launched again for
the same op, an all-or-nothing op with a machine already gone (rolled back, returned, reclaimed) and some still
missing cannot be made whole: it launches nothing and answers the refusal again (the first one, from this host's
record, or ``capacity_unavailable``). A refusal is answered only when no machine of the op is left live; when one
is (an earlier call's whose answer was lost, or a termination EC2 refused), the request is accepted as without
``allOrNothing``, its shortfall in the message and ``complete_with_error`` in ``getRequestStatus``, so the daemon
returns what it made. The record keeps the rolled-back machines (``rolledBack``) and the refusal (``refusal``):
``getRequestStatus`` reports them ``fail`` (EC2 shows them terminating), and ``listMachines`` lists them at most
while ``shutting-down`` (gone, to the daemon).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aws_ec2_plugin import batch, bootstrap, slots
from aws_ec2_plugin.config import JOIN_ADDRESS_BOUND
from aws_ec2_plugin.ec2ops import Ec2, chunks, tag_filters
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.inputs import CreateRequest
from aws_ec2_plugin.launch import Call, launch
from aws_ec2_plugin.machines import GONE_STATES, state_of
from aws_ec2_plugin.offerings import Offering, launch_order
from aws_ec2_plugin.records import Records

log = logging.getLogger(__name__)


def request_machines(
    ec2: Ec2, records: Records, request: CreateRequest, batch_size: int, terminate_batch_size: int = 50
) -> dict[str, Any]:
    """Launch the machines of ``request`` that do not exist yet. Returns ``{"requestId": op_id, "message"}``.

    Raises the mapped :class:`PluginError` only when no machine of the op exists at all (with ``allOrNothing``:
    none is live once this call's launches are terminated); once some exist the request is accepted (they must be
    polled and accounted for) and the shortfall is reported in the message and, through the record, as
    ``complete_with_error`` by ``getRequestStatus``.
    """
    cluster = request.owner_tags[bootstrap.TAG_CLUSTER]
    existing = ec2.describe(tag_filters({bootstrap.TAG_OP: request.op_id, bootstrap.TAG_CLUSTER: cluster}))
    launched: dict[str, str] = {}
    gone: set[str] = set()  # refs whose instance is terminated, terminating or stopped: never live again
    for instance in existing:
        ref = bootstrap.tag_dict(instance).get(bootstrap.TAG_INSTANCE)
        if ref:
            launched[ref] = instance["InstanceId"]
            if state_of(instance) in GONE_STATES:
                gone.add(ref)
    previous = records.load(request.op_id) or {}
    launched = {**previous.get("launched", {}), **launched}
    rolled_back: dict[str, str] = dict(previous.get("rolledBack", {}))
    gone |= rolled_back.keys()
    refs = [entry["instanceRef"] for entry in request.bootstraps]
    missing = [i for i, ref in enumerate(refs) if ref not in launched]
    offerings = launch_order(request.template)

    new: dict[str, str] = {}
    refused: tuple[str, ...] = ()
    failure: PluginError | None = None
    prefix = slots.ref_prefix(refs)
    blocked = sorted(gone & set(refs)) if request.all_or_nothing and missing else []
    if blocked:
        failure = _cannot_be_whole(request.op_id, previous, blocked)
    elif missing and request.template.join == JOIN_ADDRESS_BOUND and prefix is not None:
        outcome = batch.launch_missing(ec2, request, prefix, missing, offerings, batch_size)
        new, refused, failure = dict(outcome.launched), outcome.refused, outcome.failure
    else:
        new, refused, failure = _one_per_machine(ec2, request, missing, offerings)
    launched.update(new)
    if request.all_or_nothing and failure is not None and new:
        rolled_back.update(_roll_back(ec2, new, failure, terminate_batch_size))
    live = [ref for ref in launched if ref not in gone and ref not in rolled_back]
    refuse = failure is not None and not (live if request.all_or_nothing else launched)

    failed = {ref: failure.code for ref in refs if ref not in launched} if failure else {}
    refusal = previous.get("refusal")
    if refuse and request.all_or_nothing and failure is not None:
        refusal = refusal or {"code": failure.code, "message": failure.message, "retryable": failure.retryable}
    _save(records, request, launched, failed, rolled_back, refusal)
    if refuse:
        assert failure is not None
        raise failure
    message = f"{len(new)} launched, {len(launched) - len(new)} already existed"
    if refused:
        message += f"; refused for capacity, tried the next: {'; '.join(refused)}"[:1000]
    if failure is not None:
        message += f"; {len(failed)} of {len(refs)} not launched: {failure.code}: {failure.message}"
    return {"requestId": request.op_id, "message": message}


def _cannot_be_whole(op_id: str, previous: Mapping[str, Any], gone: Sequence[str]) -> PluginError:
    """The refusal of an all-or-nothing op that has a machine gone and some missing: the first refusal again (from
    the record), else ``capacity_unavailable``. Nothing is launched: a gone machine is never launched again."""
    first = previous.get("refusal") or {}
    why = (
        f"all or nothing: {len(gone)} machines of op {op_id!r} are gone ({', '.join(gone[:5])}) and a machine that"
        " existed is never launched again for the same op, so the request cannot be made whole"
    )
    if first.get("code"):
        return PluginError(str(first["code"]), f"{first.get('message', '')}; {why}", bool(first.get("retryable")))
    return PluginError("capacity_unavailable", why, True)


def _roll_back(ec2: Ec2, new: Mapping[str, str], failure: PluginError, batch_size: int) -> dict[str, str]:
    """Terminate the instances this call launched (``new``, ref -> id), because an all-or-nothing request fell
    short; returns those terminated. Say so in ``failure``'s message, and, when EC2 refused a termination, which
    are kept (they stay live, so the request is answered as accepted in part)."""
    done: dict[str, str] = {}
    by_id = {instance_id: ref for ref, instance_id in new.items()}
    for ids in chunks(sorted(by_id), batch_size):
        try:
            ec2.terminate(ids)
        except PluginError as err:
            log.warning("all or nothing: cannot terminate %d instances: %s: %s", len(ids), err.code, err.message)
            kept = len(new) - len(done)
            failure.message += (
                f"; all or nothing: terminated {len(done)} of the {len(new)} machines this call launched, {kept}"
                f" kept: TerminateInstances failed: {err.code}: {err.message}"
            )
            return done
        done.update((by_id[instance_id], instance_id) for instance_id in ids)
    failure.message += f"; all or nothing: the {len(new)} machines this call launched are terminated"
    return done


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


def _save(
    records: Records,
    request: CreateRequest,
    launched: dict[str, str],
    failed: dict[str, str],
    rolled_back: dict[str, str],
    refusal: Mapping[str, Any] | None,
) -> None:
    record: dict[str, Any] = {
        "kind": "create",
        "refs": [entry["instanceRef"] for entry in request.bootstraps],
        "launched": launched,
        "failed": failed,
        # Unseen launched machines get visibility_grace from the last launch, which happened in this call.
        "updated": time.time(),
    }
    if rolled_back:  # all or nothing: launched, then terminated because the request fell short
        record["rolledBack"] = rolled_back
    if refusal:  # all or nothing: the refusal answered, answered again to a replay that cannot be made whole
        record["refusal"] = dict(refusal)
    try:
        records.save(request.op_id, record)
    except OSError as exc:
        # A hint, not the truth (the tags are): losing it costs status detail only.
        log.warning("cannot write the request record for %s: %s", request.op_id, exc.strerror)
