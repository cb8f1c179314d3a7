"""One RunInstances for ``count`` machines, on the first of a template's offerings that has the capacity.

Offerings come in the template's order (``offerings.launch_order``). A ``capacity_unavailable`` answer
(InsufficientInstanceCapacity, a full subnet, a spot price too low) moves the same launch to the next offering at
once; any other failure (throttled, quota, auth, invalid) ends the launch, since another instance type would meet
it too. ``MinCount = MaxCount = count``: EC2 launches all of them on that offering or none, so a refusal leaves
nothing behind to account for, and the next offering gets the whole count. (With ``MinCount=1`` EC2 may launch
fewer than asked; the emulator always launches ``MinCount``, so that path could not be tested here.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from aws_ec2_plugin.config import Template
from aws_ec2_plugin.ec2ops import Ec2
from aws_ec2_plugin.failures import PluginError
from aws_ec2_plugin.offerings import Offering

#: Refused offerings named in an error message (a template may have 20 types x 16 subnets).
_NAMED = 12


@attrs.frozen
class Call:
    """What one launch sends besides the offering: shared by every offering it tries."""

    count: int
    user_data: str
    tags: Sequence[Mapping[str, str]]
    #: The ClientToken for an offering (the same launch on another offering is another call).
    client_token: Callable[[Offering], str]


@attrs.frozen
class Launched:
    offering_index: int
    instances: tuple[Mapping[str, Any], ...]
    #: The offerings EC2 refused for capacity before this one, as "<type> in <subnet>: <EC2 code>".
    refused: tuple[str, ...]


def launch(ec2: Ec2, template: Template, offerings: Sequence[Offering], start: int, call: Call) -> Launched:
    """Launch ``call`` on ``offerings[start]``, or the first after it with capacity.

    Raises the :class:`PluginError` of the last offering when every one refused for capacity (its message names
    them all), or at once any other error.
    """
    refused: list[str] = []
    last: PluginError | None = None
    for index in range(start, len(offerings)):
        offering = offerings[index]
        try:
            response = ec2.run_instances(run_params(template, offering, call))
        except PluginError as err:
            if err.code != "capacity_unavailable":
                raise
            refused.append(f"{offering.describe()}: {err.aws_code or err.code}")
            last = err
            continue
        return Launched(index, tuple(response), tuple(refused))
    assert last is not None, "launch() needs at least one offering from start"
    named = "; ".join(refused[:_NAMED]) + (f"; and {len(refused) - _NAMED} more" if len(refused) > _NAMED else "")
    last.message = f"every offering refused for capacity ({named}); last: {last.message}"
    raise last


def run_params(template: Template, offering: Offering, call: Call) -> dict[str, Any]:
    params: dict[str, Any] = {
        "ImageId": template.image_id,
        "InstanceType": offering.instance_type,
        "MinCount": call.count,
        "MaxCount": call.count,
        "ClientToken": call.client_token(offering),
        "UserData": call.user_data,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": list(call.tags)},
            {"ResourceType": "volume", "Tags": list(call.tags)},
        ],
        # IMDSv2 only: user-data may hold a join token, and v2's session token defeats simple SSRF reads of it.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        # An instance that halts itself is gone, not stopped (a stopped one still holds its volumes and counts
        # against limits, and nobody would start it again): the agent halts the machine when it has reached no
        # controller for the orphan timeout (user-data ``orphanTimeout``/``onOrphan``), so even a machine whose
        # daemon and controllers are all gone ends by itself.
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    if offering.subnet_id:
        params["SubnetId"] = offering.subnet_id
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
