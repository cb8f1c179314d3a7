"""Batch launches and several instance types, in process: slot tags, launch order, template prices."""

from __future__ import annotations

import pytest
from aws_ec2_plugin import bootstrap, slots
from aws_ec2_plugin.config import Config
from aws_ec2_plugin.offerings import launch_order

from provisionerd.plugin_sdk.config import ConfigInvalid


def price(amount: float, currency: str = "USD") -> dict[str, object]:
    return {
        "amount": amount,
        "currency": currency,
        "unit": "hour",
        "source": "test sheet",
        "timestamp": "2026-12-01T00:00:00Z",
    }


def template(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "templateId": "t",
        "instanceTypes": [
            {"instanceType": "c5.xlarge", "price": price(0.17)},
            {"instanceType": "m5.xlarge", "price": price(0.192)},
            {"instanceType": "c6i.xlarge", "price": price(0.17)},
        ],
        "imageId": "ami-0123456789abcdef0",
        "maxNumber": 100,
        "attributes": {"ncpus": ["Numeric", "4"]},
    }
    base.update(changes)
    return base


def config(*templates: dict[str, object]) -> Config:
    return Config.from_document({"region": "eu-west-1", "templates": list(templates)})


def test_slots_round_trip_in_order_and_split_to_fit_a_tag():
    assert slots.encode([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert slots.decode("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
    assert slots.encode([9, 3, 4]) == "9,3-4" and slots.decode("9,3-4") == (9, 3, 4)
    for bad in ("", "a", "3-1", "1-", "-1", "1,,2"):
        assert slots.decode(bad) is None, bad
    assert slots.split(range(100), 250) == [tuple(range(100))]
    assert [len(g) for g in slots.split(range(1000), 250)] == [250, 250, 250, 250]
    scattered = list(range(0, 2000, 2))  # no runs: the tag, not the count, limits a group
    groups = slots.split(scattered, 1000)
    assert [s for g in groups for s in g] == scattered
    assert all(len(slots.encode(g)) <= slots.MAX_TAG_VALUE for g in groups) and len(groups) > 1


def test_a_batch_instance_gets_its_ref_from_its_launch_index():
    assert slots.ref_prefix(["op/0", "op/1", "op/2"]) == "op/"
    assert slots.ref_prefix(["op/1", "op/2"]) is None and slots.ref_prefix(["a", "b"]) is None
    tags = {t["Key"]: t["Value"] for t in bootstrap.batch_tags({"provisionerd:op": "op"}, "op/", (3, 7, 8), "t", {})}
    assert (
        bootstrap.tag_dict({"Tags": [{"Key": k, "Value": v} for k, v in tags.items()], "AmiLaunchIndex": 1})[
            bootstrap.TAG_INSTANCE
        ]
        == "op/7"
    )
    assert slots.instance_ref(tags, 3) is None and slots.instance_ref(tags, True) is None
    # A per-machine instance keeps its own tag.
    own = {"Tags": [{"Key": bootstrap.TAG_INSTANCE, "Value": "x"}], "AmiLaunchIndex": 0}
    assert bootstrap.tag_dict(own)[bootstrap.TAG_INSTANCE] == "x"


def test_shared_user_data_holds_no_token_and_names_no_machine():
    entry = {"instanceRef": "op/4", "controllers": ["c:1"], "joinToken": "T" * 43, "orphanTimeout": 600}
    text = bootstrap.shared_user_data(entry, "cl", {"site": "x"})
    assert "T" * 43 not in text and "op/4" not in text
    assert '"join":"address-bound"' in text and '"orphanTimeout":600' in text


def test_lowest_price_orders_types_by_price_ties_as_listed_then_each_subnet():
    subnets = ["subnet-0000000a", "subnet-0000000b"]
    chosen = config(template(allocationStrategy="lowest-price", subnetIds=subnets)).templates["t"]
    order = [(o.instance_type, o.subnet_id) for o in launch_order(chosen)]
    assert order == [
        ("c5.xlarge", "subnet-0000000a"),
        ("c5.xlarge", "subnet-0000000b"),
        ("c6i.xlarge", "subnet-0000000a"),
        ("c6i.xlarge", "subnet-0000000b"),
        ("m5.xlarge", "subnet-0000000a"),
        ("m5.xlarge", "subnet-0000000b"),
    ]
    listed = config(template()).templates["t"]
    assert [o.instance_type for o in launch_order(listed)] == ["c5.xlarge", "m5.xlarge", "c6i.xlarge"]
    assert [o.subnet_id for o in launch_order(listed)] == [None, None, None]


def test_the_offer_states_the_dearest_type_and_each_machine_its_own_quote():
    chosen = config(template())
    offer = chosen.templates["t"].as_contract()
    assert offer["price"]["amount"] == 0.192  # a cost cap judged on the offer holds whichever type EC2 gives
    assert chosen.quote("t", "c6i.xlarge")["amount"] == 0.17 and chosen.quote("t", "r5.xlarge") is None


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"instanceTypes": [{"instanceType": "c5.xlarge", "price": price(0.1)}, {"instanceType": "m5.xlarge"}]},
            "every",
        ),
        ({"instanceTypes": [{"instanceType": "c5.xlarge"}], "allocationStrategy": "lowest-price"}, "lowest-price"),
        ({"price": price(0.1)}, "one or the other"),
        (
            {
                "instanceTypes": [
                    {"instanceType": "c5.xlarge", "price": price(0.1, "EUR")},
                    {"instanceType": "m5.xlarge", "price": price(0.1)},
                ]
            },
            "currencies",
        ),
        ({"instanceType": "c5.xlarge"}, "not both"),
        ({"subnetId": "subnet-0000000a", "subnetIds": ["subnet-0000000b"]}, "subnet"),
        ({"join": "secret-in-tags"}, "join"),
    ],
)
def test_templates_that_cannot_be_honoured_are_refused(changes, fragment):
    with pytest.raises(ConfigInvalid) as caught:
        config(template(**changes))
    assert fragment in caught.value.message or any(fragment in p for p in caught.value.problems), caught.value.message
