"""The EC2 calls the plugin makes, each one mapped to :class:`PluginError` on failure.

Reads go through DescribeInstances with filters only (never ``InstanceIds``, which fails the whole call when one id
is unknown), paginated, with at most ``describe_batch_size`` values per filter (AWS allows 200).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from aws_ec2_plugin.failures import PluginError, from_exception

T = TypeVar("T")
_PAGE_SIZE = 1000
NOT_FOUND = "InvalidInstanceID.NotFound"
MAX_INSTANCES = 100_000  # a bound on one listing: far above any cluster, far below running out of memory


def call(operation: str, fn: Callable[..., T], **kwargs: Any) -> T:
    """Run one boto3 call; any failure becomes a :class:`PluginError` naming ``operation``."""
    try:
        return fn(**kwargs)
    except Exception as exc:  # noqa: BLE001 - botocore raises many unrelated types; all are mapped, none leak
        raise from_exception(exc, operation) from None


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def tag_filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{key}", "Values": [value]} for key, value in sorted(tags.items())]


class Ec2:
    """The plugin's view of one EC2 client (region, endpoint and retries are the client's business)."""

    def __init__(self, client: Any, describe_batch_size: int = 200) -> None:
        self.client = client
        self.describe_batch_size = describe_batch_size

    def describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every instance matching all ``filters`` (any state, unless a filter says otherwise)."""
        found: list[dict[str, Any]] = []
        try:
            pages = self.client.get_paginator("describe_instances").paginate(
                Filters=filters, PaginationConfig={"PageSize": _PAGE_SIZE}
            )
            for page in pages:
                for reservation in page.get("Reservations", ()):
                    found.extend(reservation.get("Instances", ()))
                if len(found) > MAX_INSTANCES:
                    raise PluginError(
                        "provider_error", f"DescribeInstances matched more than {MAX_INSTANCES} instances"
                    )
        except PluginError:
            raise
        except Exception as exc:  # noqa: BLE001 - see call()
            raise from_exception(exc, "DescribeInstances") from None
        return found

    def describe_page(
        self, filters: list[dict[str, Any]], token: str | None, max_results: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of DescribeInstances: EC2's own ``MaxResults`` (5 to 1000) and ``NextToken``. The instances
        of the page, and the token of the next one (None: the last)."""
        params: dict[str, Any] = {"Filters": filters, "MaxResults": max(5, min(1000, max_results))}
        if token:
            params["NextToken"] = token
        out = call("DescribeInstances", self.client.describe_instances, **params)
        instances = [i for r in out.get("Reservations", ()) for i in r.get("Instances", ())]
        return instances, out.get("NextToken") or None

    def describe_values(self, name: str, values: Sequence[str], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Instances whose filter ``name`` matches any of ``values`` and all ``extra`` filters, in batches."""
        found: list[dict[str, Any]] = []
        for batch in chunks(values, self.describe_batch_size):
            found += self.describe([{"Name": name, "Values": list(batch)}, *extra])
        return found

    def run_instances(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The instances one RunInstances launched (``MinCount`` to ``MaxCount`` of them)."""
        response = call("RunInstances", self.client.run_instances, **params)
        return list(response["Instances"])

    def create_tags(self, ids: Sequence[str], tags: Mapping[str, str]) -> None:
        call(
            "CreateTags",
            self.client.create_tags,
            Resources=list(ids),
            Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
        )

    def terminate(self, ids: Sequence[str]) -> None:
        self._per_batch("TerminateInstances", self.client.terminate_instances, ids)

    def stop(self, ids: Sequence[str]) -> None:
        self._per_batch("StopInstances", self.client.stop_instances, ids)

    def _per_batch(self, operation: str, fn: Callable[..., Any], ids: Sequence[str]) -> None:
        """One call for the batch; if an id vanished meanwhile (EC2 then fails the whole call), one call per id.

        A vanished instance is not an error here: returning a machine that is gone already is harmless.
        """
        try:
            call(operation, fn, InstanceIds=list(ids))
            return
        except PluginError as err:
            if err.aws_code != NOT_FOUND:
                raise
        if len(ids) == 1:
            return
        for instance_id in ids:
            try:
                call(operation, fn, InstanceIds=[instance_id])
            except PluginError as err:
                if err.aws_code != NOT_FOUND:
                    raise
