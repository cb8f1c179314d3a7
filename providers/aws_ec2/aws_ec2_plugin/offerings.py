"""Where a template's machines may be launched, in the order they are tried: pure, no I/O.

An offering is one (instance type, subnet) of a template. :func:`launch_order` lists them by the template's
``allocationStrategy``:

- ``prioritized``: instance types as listed;
- ``lowest-price``: by each type's configured price (the plugin queries no price API), ties as listed;

and, for each type, every subnet as listed (none: EC2's default subnet). A launch that EC2 refuses for capacity
(``capacity_unavailable``: InsufficientInstanceCapacity, a full subnet, a spot price too low) moves on to the next
offering within the same ``requestMachines`` call, so a capacity error costs one API call, not a round.

Why not EC2 Fleet (CreateFleet ``instant``, whose ``price-capacity-optimized`` strategy reads EC2's live capacity):
it needs a launch template per request (created, then deleted), and it does not say which instance of a fleet is
which machine of the request, where RunInstances gives every instance its ``AmiLaunchIndex`` (see ``slots``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from aws_ec2_plugin.config import LOWEST_PRICE, Template


@attrs.frozen
class Offering:
    instance_type: str
    subnet_id: str | None
    #: The configured price of one machine of this type (None: the config documents none).
    price: Mapping[str, Any] | None

    def describe(self) -> str:
        return f"{self.instance_type} in {self.subnet_id or 'the default subnet'}"


def launch_order(template: Template) -> tuple[Offering, ...]:
    """Every offering of ``template``, in the order a launch tries them."""
    options = list(template.instance_types)
    if template.allocation_strategy == LOWEST_PRICE:
        # sorted() is stable: equal prices keep the listed order. The config guarantees every type a price here.
        options.sort(key=lambda o: float(o.price["amount"]) if o.price is not None else float("inf"))
    subnets: tuple[str | None, ...] = template.subnet_ids or (None,)
    return tuple(
        Offering(o.instance_type, subnet, template.quote(o.instance_type)) for o in options for subnet in subnets
    )
