"""The plugin object: configuration, Slurm access and records, and one method that answers any action.

Inputs are checked against the contract's own schemas (``provisionerd.provider.schemas``) before anything touches
Slurm: the daemon checks them too, but a plugin must not trust its caller with ``scancel``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from provisionerd.plugin_sdk.calls import dispatch
from provisionerd.plugin_sdk.documents import describe
from provisionerd.provider.schemas import contract
from slurm_plugin import release, status, submit
from slurm_plugin.cluster import SlurmCluster
from slurm_plugin.config import Config
from slurm_plugin.store import Store

NAME = "slurm"
VERSION = "0.1.0"


class Plugin:
    def __init__(self, config: Config, store: Store, cluster: SlurmCluster | None = None) -> None:
        self.config = config
        self.store = store
        self.cluster = cluster or SlurmCluster(config)
        self._actions: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
            "describeProvider": lambda doc: self.describe(),
            "getAvailableTemplates": lambda doc: {"templates": [t.as_contract() for t in config.templates.values()]},
            "requestMachines": lambda doc: submit.request_machines(config, self.cluster, store, doc),
            "getRequestStatus": lambda doc: status.get_request_status(config, self.cluster, store, doc),
            "requestReturnMachines": lambda doc: release.request_return(config, self.cluster, store, doc),
            "getReturnRequests": lambda doc: release.get_return_requests(config, self.cluster, store, doc),
            "listMachines": lambda doc: status.list_machines(config, self.cluster, doc),
        }

    @classmethod
    def from_environment(cls) -> Plugin:
        return cls(Config.from_environment(), Store.from_environment())

    def describe(self) -> dict[str, Any]:
        priced = any(t.price is not None for t in self.config.templates.values())
        return {**describe(NAME, VERSION, price_quotes=priced), "partition": self.config.partition}  # ext

    def handle(self, action: str, doc: Any) -> dict[str, Any]:
        """The action's result document; raises ``PluginError``."""
        return dispatch(self._actions, action, doc, contract().input_problems)
