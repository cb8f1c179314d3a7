"""Owner tags on a pod and its Secret: labels to select by, one annotation with the exact tags, derived names.

Label values are at most 63 characters of ``[A-Za-z0-9._-]`` (alphanumeric at both ends), and an op_id may hold
``:`` and 64 characters, a cluster id anything. So each owner tag is a label whose value is the tag itself when
it is a valid label value that does not start with ``h.``, else ``h.`` and 40 hex digits of its SHA-256: one
value maps to one label value, and a label selector finds exactly the pods with that tag (up to a SHA-256
collision). The exact tags are in the annotation ``provisionerd/tags`` (JSON); a pod whose annotation is missing,
malformed or disagrees with its labels is not ours and is never listed, returned or deleted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

CLUSTER = "provisionerd:cluster"
PROVIDER = "provisionerd:provider"
OP = "provisionerd:op"
EPOCH = "provisionerd:epoch"
INSTANCE = "provisionerd:instance"
OWNER_KEYS = (CLUSTER, PROVIDER, OP, EPOCH)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "provisionerd"
TAGS_ANNOTATION = "provisionerd/tags"
#: The op_id of the return that deleted the pod (set just before the delete): a pod deleted by anyone else
#: (an eviction, a drain, a user) is reclaimed, not returned.
RETURNED_LABEL = "provisionerd/returned"
TEMPLATE_LABEL = "provisionerd/template"
#: Owner tag keys with a label of their own (the others are only in the annotation).
LABEL_OF = {
    CLUSTER: "provisionerd/cluster",
    PROVIDER: "provisionerd/provider",
    OP: "provisionerd/op",
    EPOCH: "provisionerd/epoch",
    INSTANCE: "provisionerd/instance",
}
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)$")
MAX_ANNOTATION = 16384


def label_value(value: str) -> str:
    if _LABEL_VALUE.match(value) and not value.startswith("h."):
        return value
    return "h." + hashlib.sha256(value.encode()).hexdigest()[:40]


def labels_for(tags: Mapping[str, str]) -> dict[str, str]:
    out = {MANAGED_BY: MANAGER}
    for key, label in LABEL_OF.items():
        if key in tags:
            out[label] = label_value(tags[key])
    return out


def selector(tags: Mapping[str, str]) -> str:
    """The label selector for resources of ours carrying ``tags`` (keys without a label are checked later)."""
    parts = [f"{MANAGED_BY}={MANAGER}"]
    parts += [f"{label}={label_value(tags[key])}" for key, label in sorted(LABEL_OF.items()) if key in tags]
    return ",".join(parts)


def annotation_for(tags: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(tags.items())), separators=(",", ":"))


def tags_of(metadata: Mapping[str, Any]) -> dict[str, str] | None:
    """The owner tags of a pod or Secret we made (its ``metadata`` as the API gave it); None: not ours."""
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    text = annotations.get(TAGS_ANNOTATION)
    if labels.get(MANAGED_BY) != MANAGER or not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        return None
    try:
        tags = json.loads(text)
    except ValueError:
        return None
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        return None
    if not tags.get(CLUSTER) or labels_for(tags) != {
        k: v for k, v in labels.items() if k == MANAGED_BY or k in LABEL_OF.values()
    }:
        return None
    return tags


def matches(tags: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(tags.get(k) == v for k, v in wanted.items())


def cluster_hash(cluster: str) -> str:
    return hashlib.sha256(cluster.encode()).hexdigest()[:8]


def pod_name(cluster: str, op_id: str, index: int) -> str:
    """``pvd-<16 hex of sha256(cluster, op_id)>-<index>``: a retry of the same op makes the same names, so the
    API server itself refuses a second pod (``AlreadyExists``)."""
    digest = hashlib.sha256(f"{cluster}\0{op_id}".encode()).hexdigest()[:16]
    return f"pvd-{digest}-{index}"
