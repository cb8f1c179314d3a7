"""How much one frame may make a receiver do: list lengths per field and decoding units per message kind.

The cost of decoding is not the frame's size: 1 MiB can hold 250,000 zero-size structs (one word each for the
reader's traversal limit, one Python object each for us: seconds of CPU). So the codec checks every list's length
against ``list_cap`` *before* it reads one element, and counts units (one per struct it builds, one per map entry)
against ``max_units`` of the frame's kind; either overrun is ``FrameOverBounds``. Lists of ``Text`` cost one cheap
copy per entry and are bounded by their list cap alone.

The caps follow what a legitimate sender produces: a page holds at most ``PAGE_ITEMS`` items (``paging``), a Join
at most ``MAX_PROVIDERS`` provider names, an admin demand at most ``MAX_ADMIN_DEMAND_ITEMS`` items (a 1 MiB frame
cannot hold many more real ones). docs/protocol.md §2 states them for other implementations.
"""

from __future__ import annotations

#: Items per demand page, resync page (facts, and hosts) and host push.
PAGE_ITEMS = 500
MAX_PROVIDERS = 1000
MAX_ADMIN_DEMAND_ITEMS = 20_000
#: A worker's capability report (``Join``, ``WorkerStatus``, ``HostState.capabilities``): a host costs at most 9
#: units.
MAX_CAPABILITIES = 8
#: A list field that is not named below (the lists inside a demand item or a fact).
DEFAULT_LIST_CAP = 4096

#: ``(schema struct name, wire field name) -> the most elements the list may hold``.
LIST_CAPS: dict[tuple[str, str], int] = {
    ("Join", "providers"): MAX_PROVIDERS,
    ("ResyncRequest", "providers"): MAX_PROVIDERS,
    ("DemandPage", "items"): PAGE_ITEMS,
    ("ResyncPage", "facts"): PAGE_ITEMS,
    ("ResyncPage", "hosts"): PAGE_ITEMS,
    ("HostStatePush", "hosts"): PAGE_ITEMS,
    ("AdminSetDemand", "items"): MAX_ADMIN_DEMAND_ITEMS,
    ("HistoryQuery", "providers"): MAX_PROVIDERS,
    ("HistoryPage", "facts"): PAGE_ITEMS,
    ("Join", "capabilities"): MAX_CAPABILITIES,
    ("HostState", "capabilities"): MAX_CAPABILITIES,
    ("WorkerStatus", "capabilities"): MAX_CAPABILITIES,
}

#: Units (structs built plus map entries) one frame may cost, by ``Frame.body`` member; ``DEFAULT_MAX_UNITS`` for
#: the rest. A full legitimate page is about 3,000 units; an admin demand of 20,000 items with a few attributes
#: each about 100,000.
DEFAULT_MAX_UNITS = 10_000
MAX_UNITS: dict[str, int] = {"adminSetDemand": 120_000}


#: The largest body each kind may have, checked once its kind is known and before the rest of it is read (the
#: frame limit for the kinds not named). A Join holds at most 1000 provider names of 256 characters; the small
#: control messages have room to grow new fields.
SMALL_BODY = 16 * 1024
MAX_BODY_BYTES: dict[str, int] = {
    "join": 512 * 1024,
    "historyQuery": 512 * 1024,  # like a Join: at most 1000 provider names
    **dict.fromkeys(
        (
            "joinReply", "heartbeat", "heartbeatAck", "errorMsg", "rejected", "ack", "leaseAcquire", "leaseRenew",
            "leaseRelease", "leaseGrant", "leaseDenied", "factAck", "workerStatus", "adminFailover",
            "adminQuorum", "adminStatus", "leaseFreed",
        ),
        SMALL_BODY,
    ),
}  # fmt: skip


def max_body_bytes(member: str, frame_limit: int) -> int:
    return min(MAX_BODY_BYTES.get(member, frame_limit), frame_limit)


def list_cap(struct_name: str, field: str) -> int:
    return LIST_CAPS.get((struct_name, field), DEFAULT_LIST_CAP)


def max_units(member: str) -> int:
    return MAX_UNITS.get(member, DEFAULT_MAX_UNITS)
