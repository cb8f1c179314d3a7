"""The launches of a ``join: address-bound`` request: many machines per RunInstances, no secret in user-data.

The missing slots of the request (machines no instance of the op is yet) are cut into groups that one call can
launch: at most ``launch_batch_size`` machines, slots whose encoding fits a tag (``slots.split``), and machines whose
bootstraps agree on what user-data carries (``bootstrap.shared_key``: the controllers, the orphan timeout; the
daemon gives every machine of a request the same). Each group is one RunInstances (``launch.launch``: the next
offering on a capacity refusal), tagged at creation with the owner tags and its slots, with the ClientToken
``bootstrap.batch_client_token(op_id, slots, offering)``.

A demand of 100 is one call; 1,000 with the default batch size of 250 is four.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from aws_ec2_plugin import bootstrap, slots
from aws_ec2_plugin.ec2ops import Ec2
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.inputs import CreateRequest
from aws_ec2_plugin.launch import Call, launch
from aws_ec2_plugin.offerings import Offering


@attrs.frozen
class Outcome:
    #: instanceRef -> instance id, of the machines launched now.
    launched: Mapping[str, str]
    refused: tuple[str, ...]
    #: Set when a group could not be launched; the groups after it were not tried.
    failure: PluginError | None


def launch_missing(
    ec2: Ec2,
    request: CreateRequest,
    prefix: str,
    missing: Sequence[int],
    offerings: Sequence[Offering],
    batch_size: int,
) -> Outcome:
    """Launch the bootstraps at the ``missing`` indexes of ``request`` (whose refs are ``prefix`` + index)."""
    cluster = request.owner_tags[bootstrap.TAG_CLUSTER]
    template = request.template
    launched: dict[str, str] = {}
    refused: list[str] = []
    start = 0
    for group in _groups(request, missing, batch_size):
        entry = request.bootstraps[group[0]]
        call = Call(
            count=len(group),
            user_data=bootstrap.shared_user_data(
                entry, cluster, request.passthrough, template.probes, template.reprobe_interval
            ),
            tags=bootstrap.batch_tags(request.owner_tags, prefix, group, template.template_id, template.extra_tags),
            client_token=functools.partial(_client_token, request.op_id, group),
        )
        try:
            done = launch(ec2, template, offerings, start, call)
        except PluginError as err:
            return Outcome(launched, tuple(refused), err)
        refused += done.refused
        start = done.offering_index  # the offerings that refused are not asked again in this call
        tags = dict(_tags(call.tags))
        for instance in done.instances:
            ref = slots.instance_ref(tags, instance.get("AmiLaunchIndex"))
            if ref is None:
                # Not seen from EC2 or the emulator. The instance is tagged with the op, so the orphan scan sees
                # it; stop here and keep the record of what was launched so far.
                failure = PluginError("provider_error", f"EC2 gave instance {instance['InstanceId']} no launch index")
                return Outcome(launched, tuple(refused), failure)
            launched[ref] = instance["InstanceId"]
    return Outcome(launched, tuple(refused), None)


def _client_token(op_id: str, group: Sequence[int], offering: Offering) -> str:
    return bootstrap.batch_client_token(op_id, group, f"{offering.instance_type}|{offering.subnet_id}")


def _groups(request: CreateRequest, missing: Sequence[int], batch_size: int) -> list[tuple[int, ...]]:
    by_key: dict[tuple[Any, ...], list[int]] = {}
    for index in missing:
        by_key.setdefault(bootstrap.shared_key(request.bootstraps[index]), []).append(index)
    return [group for indexes in by_key.values() for group in slots.split(indexes, batch_size)]


def _tags(tags: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    return [(t["Key"], t["Value"]) for t in tags]
