"""Request ids that carry their op_id: ``<prefix>-<kind>@<cluster hash>@<op_id>``.

A plugin whose infrastructure remembers nothing but tags can answer ``getRequestStatus`` from the id alone: the
kind (``req`` for a create, ``ret`` for a return), the cluster it was made for, and the op_id to look machines up
by. ``@`` cannot occur in an op_id (``[A-Za-z0-9._:-]``), so the parts always split back.
"""

from __future__ import annotations

KINDS = ("req", "ret")


def make_request_id(prefix: str, kind: str, cluster_hash: str, op_id: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    return f"{prefix}-{kind}@{cluster_hash}@{op_id}"


def parse_request_id(prefix: str, request_id: str) -> tuple[str, str, str] | None:
    """``(kind, cluster hash, op_id)``, or None for an id this plugin (``prefix``) did not make."""
    parts = request_id.split("@")
    if len(parts) != 3 or parts[0] not in {f"{prefix}-{kind}" for kind in KINDS} or not parts[2]:
        return None
    return parts[0][len(prefix) + 1 :], parts[1], parts[2]
