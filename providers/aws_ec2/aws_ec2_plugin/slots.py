"""Which machine of a request an instance is, when one RunInstances call launched many: pure, no I/O.

One call launches n instances with one set of tags (TagSpecifications apply to every instance of the call), so a
tag cannot name each instance's ``instanceRef``. What EC2 does give each instance of a call is its
``AmiLaunchIndex`` (0..n-1, in the call's reservation). So a batch call carries two tags shared by its instances:

- ``provisionerd:ref-prefix``: P, when the request's refs are P + "0", P + "1", ... (the daemon's are
  ``<op_id>/<i>``);
- ``provisionerd:slots``: the slot numbers this call launches, as ranges (``"0-99"``, ``"3,7-9"``), in order.

The instance with launch index k is slot ``slots[k]``, its ref P + str(slots[k]). Both tags are set at creation,
so the ref is as durable as a per-instance tag, and any host (a new lease holder without this host's records)
derives the same ref from DescribeInstances alone. :func:`instance_ref` is the one place that reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TAG_SLOTS = "provisionerd:slots"
TAG_REF_PREFIX = "provisionerd:ref-prefix"
#: EC2's limit on a tag value: a call's slot list must fit, else the slots go in more calls.
MAX_TAG_VALUE = 256


def ref_prefix(refs: Sequence[str]) -> str | None:
    """P when ``refs`` are exactly P + "0" .. P + str(len(refs) - 1) in order and P fits a tag; else ``None``."""
    if not refs or not refs[0].endswith("0"):
        return None
    prefix = refs[0][:-1]
    if len(prefix) > MAX_TAG_VALUE or any(ref != f"{prefix}{i}" for i, ref in enumerate(refs)):
        return None
    return prefix


def decode(text: str) -> tuple[int, ...] | None:
    """The inverse of :func:`encode`; ``None`` for anything this plugin did not write."""
    out: list[int] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo or hi - lo > 100_000 or len(out) > 100_000:
            return None
        out.extend(range(lo, hi + 1))
    return tuple(out)


def _runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """``slots`` as ``(first, last)`` runs of consecutive numbers, in order."""
    runs: list[tuple[int, int]] = []
    for slot in slots:
        if runs and slot == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], slot)
        else:
            runs.append((slot, slot))
    return runs


def encode(slots: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"`` (the order kept: runs are taken as they come)."""
    return ",".join(_run_text(first, last) for first, last in _runs(slots))


def _run_text(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def split(slots: Sequence[int], max_count: int) -> list[tuple[int, ...]]:
    """``slots`` in consecutive groups of at most ``max_count`` whose encoding fits a tag value."""
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, not {max_count!r}")
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0  # the encoding's length of ``current``
    for first, last in _runs(slots):
        while first <= last:
            room = max_count - len(current)
            end = min(last, first + room - 1)
            cost = len(_run_text(first, end)) + (1 if current else 0)
            if current and (room == 0 or size + cost > MAX_TAG_VALUE):
                groups.append(tuple(current))
                current, size = [], 0
                continue
            current.extend(range(first, end + 1))
            size += cost
            first = end + 1
    if current:
        groups.append(tuple(current))
    return groups


def instance_ref(tags: Mapping[str, str], launch_index: object) -> str | None:
    """The ref of an instance launched by a batch call (its tags and ``AmiLaunchIndex``); ``None`` otherwise."""
    prefix, text = tags.get(TAG_REF_PREFIX), tags.get(TAG_SLOTS)
    if prefix is None or text is None or not isinstance(launch_index, int) or isinstance(launch_index, bool):
        return None
    slots = decode(text)
    if slots is None or not 0 <= launch_index < len(slots):
        return None
    return f"{prefix}{slots[launch_index]}"
