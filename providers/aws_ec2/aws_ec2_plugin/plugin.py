"""One plugin instance: the config, a lazily built EC2 client, and the table of contract actions.

Both transports (one-shot ``<action>.sh`` and the persistent ``provider``) call :meth:`Plugin.handle`; it returns
the action's result document or raises :class:`PluginError`. The client is built on first use, so
``describeProvider`` and ``getAvailableTemplates`` work without credentials or network.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from aws_ec2_plugin import __version__, inputs, machines, release, status
from aws_ec2_plugin.config import Config
from aws_ec2_plugin.create import request_machines
from aws_ec2_plugin.ec2client import make_client
from aws_ec2_plugin.ec2ops import Ec2, tag_filters
from aws_ec2_plugin.failures import PluginError, from_exception
from aws_ec2_plugin.records import Records
from aws_ec2_plugin.redact import Redactor
from provisionerd.plugin_sdk.documents import describe

CONTRACT_VERSION = 1


class Plugin:
    def __init__(
        self,
        config: Config,
        redactor: Redactor,
        *,
        cluster: str | None,
        provider_name: str,
        data_dir: str | None,
        client_factory: Callable[[Config, Redactor], Any] = make_client,
    ) -> None:
        self.config = config
        self.redactor = redactor
        self.cluster = cluster or None
        self.provider_name = provider_name
        self.records = Records(data_dir)
        self._client_factory = client_factory
        self._ec2: Ec2 | None = None
        self._lock = threading.Lock()
        self._actions: dict[str, Callable[[Any], dict[str, Any]]] = {
            "describeProvider": self.describe_provider,
            "getAvailableTemplates": self.get_available_templates,
            "requestMachines": self.request_machines,
            "getRequestStatus": self.get_request_status,
            "requestReturnMachines": self.request_return_machines,
            "getReturnRequests": self.get_return_requests,
            "listMachines": self.list_machines,
            "stopMachines": self.stop_machines,
        }

    @classmethod
    def from_environment(cls, redactor: Redactor) -> Plugin:
        """Config from ``$PRO_CONF_DIR``, records under ``$PRO_DATA_DIR``, cluster from ``$PROVISIONERD_CLUSTER``."""
        return cls(
            Config.from_conf_dir(),
            redactor,
            cluster=os.environ.get("PROVISIONERD_CLUSTER"),
            provider_name=os.environ.get("PROVIDER_NAME") or "aws_ec2",
            data_dir=os.environ.get("PRO_DATA_DIR") or None,
        )

    @property
    def ec2(self) -> Ec2:
        with self._lock:
            if self._ec2 is None:
                try:
                    client = self._client_factory(self.config, self.redactor)
                except Exception as exc:  # noqa: BLE001 - profile/credential resolution raises botocore types
                    raise from_exception(exc, "client setup") from None
                self._ec2 = Ec2(client, self.config.describe_batch_size)
            return self._ec2

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        handler = self._actions.get(action)
        if handler is None:
            raise PluginError("invalid_request", f"unknown action {action!r}")
        if not isinstance(doc, dict):
            raise PluginError("invalid_request", "input must be a JSON object")
        return handler(doc)

    # --- read-only --------------------------------------------------------------------------------------------

    def describe_provider(self, doc: dict[str, Any]) -> dict[str, Any]:
        # Only prices the config documents (source and date); this plugin queries no price API. allOrNothing: a
        # request that falls short terminates what it launched and is refused (create.py). reclaimsByTags:
        # getReturnRequests with tags also answers every instance carrying them (status.return_requests).
        return describe(
            self.provider_name,
            __version__,
            stop_machines=True,
            price_quotes=self.config.has_prices,
            allOrNothing=True,
            reclaimsByTags=True,
        )

    def get_available_templates(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"templates": [t.as_contract() for t in self.config.templates.values()]}

    def get_request_status(self, doc: dict[str, Any]) -> dict[str, Any]:
        ids = inputs.request_ids(doc)
        return status.request_status(
            self.ec2, self.records, ids, self.cluster, self.config.visibility_grace, self.config.quote
        )

    def get_return_requests(self, doc: dict[str, Any]) -> dict[str, Any]:
        ids = inputs.machine_ids(doc, required=False)
        # reclaimsByTags: with tags (which must name the cluster, as for listMachines), also every instance carrying
        # them that is wanted back, found by filters; the two answers merged, each machine once.
        tags = inputs.tag_filter(doc) if "tags" in doc else None
        _, _, size = inputs.paging({k: v for k, v in doc.items() if k != "cursor"})
        cursor = doc.get("cursor")
        if cursor is not None and (not isinstance(cursor, str) or not inputs.INSTANCE_ID.match(cursor)):
            raise PluginError("invalid_request", "cursor: not one this plugin gave")
        out = status.return_requests(
            self.ec2, ids, self.cluster, self.config.reclaim_tag, self.config.reclaim_grace_period, tags
        )
        # Keyset pages in machineId order (every page asks EC2 again: a by-tags answer is the few wanted back).
        wanted = sorted(
            (r for r in out["requests"] if cursor is None or r["machineId"] > cursor), key=lambda r: r["machineId"]
        )
        if size is not None and len(wanted) > size:
            return {**out, "requests": wanted[:size], "nextCursor": wanted[size - 1]["machineId"]}
        return {**out, "requests": wanted}

    def list_machines(self, doc: dict[str, Any]) -> dict[str, Any]:
        tags = inputs.tag_filter(doc)
        filters = tag_filters(tags) + [{"Name": "instance-state-name", "Values": list(machines.LIVE_STATES)}]
        skip, token, size = inputs.paging(doc)
        if size is None:  # a daemon that does not page: everything (up to MAX_INSTANCES)
            return {"machines": [machines.listed(i) for i in self.ec2.describe(filters)]}
        # One EC2 page per call, through its own NextToken/MaxResults (see inputs.paging for the cursor).
        instances, next_token = self.ec2.describe_page(filters, token, skip + size)
        page = instances[skip : skip + size]
        out: dict[str, Any] = {"machines": [machines.listed(i) for i in page]}
        if skip + size < len(instances):
            out["nextCursor"] = f"{skip + size}:{token or ''}"
        elif next_token:
            out["nextCursor"] = f"0:{next_token}"
        return out

    # --- mutations --------------------------------------------------------------------------------------------

    def request_machines(self, doc: dict[str, Any]) -> dict[str, Any]:
        request = inputs.create_request(doc, self.config, self.cluster)
        with self.records.exclusive(request.op_id):
            return request_machines(
                self.ec2, self.records, request, self.config.launch_batch_size, self.config.terminate_batch_size
            )

    def request_return_machines(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self._release(doc, machines.RETURN)

    def stop_machines(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self._release(doc, machines.STOP)

    def _release(self, doc: dict[str, Any], kind: str) -> dict[str, Any]:
        ids = inputs.machine_ids(doc, required=True)
        op_id = inputs.op_id_of(doc)
        tags = inputs.owner_tags(doc, op_id, self.cluster)
        with self.records.exclusive(op_id):
            return release.release(
                self.ec2, self.records, kind, op_id, tags[inputs.TAG_CLUSTER], ids, self.config.terminate_batch_size
            )
