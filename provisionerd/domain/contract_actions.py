"""The plugin contract's action names, in one place for every layer that names them (the schemas and transports in
``provider``, the proofs of a one-shot plugin directory in ``config``)."""

from __future__ import annotations

#: Every action of the contract. The first five are the LSF resource connector's; the rest are our extensions.
CONTRACT_ACTIONS = (
    "getAvailableTemplates",
    "requestMachines",
    "requestReturnMachines",
    "getRequestStatus",
    "getReturnRequests",
    "describeProvider",
    "listMachines",
    "stopMachines",
    "listLicenses",
    "returnLicenses",
)
