"""Owner tags on a Slurm job: carried in its comment, and the names derived from them.

A comment we wrote looks like ``provisionerd-v1 provisionerd:cluster=c1 provisionerd:op=op-7 ...``: a marker word,
then ``key=value`` pairs separated by single spaces, keys sorted, both sides percent-encoded (RFC 3986 unreserved
characters and ``:`` stay as they are). So a tag value can hold any character, yet the comment has no space inside a
pair, no ``|`` (our squeue field separator) and no newline, and a human can still read it in ``squeue``.

Anything else in a comment (another tool's text, a user's note, a malformed pair) makes it "not ours": such a job is
never listed, never cancelled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from urllib.parse import quote, unquote

MARKER = "provisionerd-v1"
CLUSTER = "provisionerd:cluster"
PROVIDER = "provisionerd:provider"
OP = "provisionerd:op"
EPOCH = "provisionerd:epoch"
INSTANCE = "provisionerd:instance"
#: Added (with the return op_id) to the comment of a job we cancel, so a cancellation by anyone else stays
#: recognisable even when the plugin's own state directory is lost.
RETURNED = "provisionerd:returned"
#: Slurm keeps comments far longer, but bounded input keeps every parse cheap.
MAX_COMMENT = 8192


def _enc(text: str) -> str:
    return quote(text, safe=":")


def encode(tags: Mapping[str, str]) -> str:
    """The comment carrying ``tags``."""
    return " ".join([MARKER, *(f"{_enc(k)}={_enc(v)}" for k, v in sorted(tags.items()))])


def decode(comment: str) -> dict[str, str] | None:
    """The tags in a comment we wrote; ``None`` for any other comment (not ours)."""
    if len(comment) > MAX_COMMENT:
        return None
    words = comment.split(" ")
    if words[0] != MARKER:
        return None
    tags: dict[str, str] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not key or "=" in value:
            return None
        try:
            tags[unquote(key, errors="strict")] = unquote(value, errors="strict")
        except UnicodeDecodeError:
            return None
    return tags if tags.get(CLUSTER) else None


def with_returned(comment_tags: Mapping[str, str], return_op: str) -> str:
    return encode({**comment_tags, RETURNED: return_op})


def machine_key(cluster: str, op_id: str, instance_ref: str) -> str:
    """20 hex digits naming one machine of one request: its job name and token file name come from it."""
    digest = hashlib.sha256(f"{cluster}\0{op_id}\0{instance_ref}".encode()).hexdigest()
    return digest[:20]


def job_name(tags: Mapping[str, str]) -> str:
    """The job name of the machine these tags describe (``scancel --name`` binds a cancel to it)."""
    return "pvd-" + machine_key(tags.get(CLUSTER, ""), tags.get(OP, ""), tags.get(INSTANCE, ""))


def cluster_hash(cluster: str) -> str:
    return hashlib.sha256(cluster.encode()).hexdigest()[:8]


def matches(tags: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(tags.get(k) == v for k, v in wanted.items())
