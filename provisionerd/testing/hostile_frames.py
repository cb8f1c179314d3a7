"""Hand-built hostile frame bodies: a list of empty elements as long as a frame allows, for tests and benches.

``list_bomb("adminSetDemand", ("items",))`` is the frame of issue 16: 1 MiB holding 250,000 zero-size structs.
pycapnp cannot build it (it gives every element its schema size), so the words are laid out here by hand after
the Cap'n Proto encoding spec: one segment, the root ``Frame``, then each struct of ``path`` right after its parent,
then the list. Each struct is given the sizes its schema declares, so every pointer is where a reader looks; the
list's elements are zero-size structs (a composite list whose tag says 0 data and 0 pointer words: cheap in
words, one Python object each to decode) or null pointers (a list of ``Text``, one word each).
"""

from __future__ import annotations

import struct
from typing import Any

from provisionerd.wire.codec import schema, wire_name
from provisionerd.wire.framing import DEFAULT_MAX_FRAME

_NO_DISCRIMINANT = 0xFFFF
#: Cap'n Proto list element sizes (the spec's ``C`` field).
_POINTER, _COMPOSITE = 6, 7


def _struct_pointer(at: int, target: int, data: int, pointers: int) -> int:
    offset = (target - at - 1) & 0x3FFFFFFF
    return (offset << 2) | (data << 32) | (pointers << 48)


def _list_pointer(at: int, target: int, element_size: int, count: int) -> int:
    offset = (target - at - 1) & 0x3FFFFFFF
    return (offset << 2) | 1 | (element_size << 32) | (count << 35)


def _sizes(node_schema: Any) -> tuple[int, int]:
    return node_schema.node.struct.dataWordCount, node_schema.node.struct.pointerCount


def _set_discriminant(words: list[int], struct_at: int, node_schema: Any, field: Any) -> None:
    value = field.proto.discriminantValue
    if value == _NO_DISCRIMINANT:
        return
    offset = node_schema.node.struct.discriminantOffset  # in 16-bit units from the start of the data section
    word, shift = struct_at + offset // 4, (offset % 4) * 16
    words[word] |= value << shift


def list_bomb(member: str, path: tuple[str, ...], count: int | None = None, size: int = DEFAULT_MAX_FRAME) -> bytes:
    """A ``Frame`` body of exactly ``size`` bytes whose body is ``member`` and whose list at ``path`` (field names,
    in snake_case or the schema's spelling; the last one is the list) holds ``count`` empty elements (default: as
    many as fit, up to 250,000 zero-size structs)."""
    frame = schema().Frame.schema
    body = frame.fields["body"].schema
    words = [0]  # the root pointer
    frame_at = len(words)
    data, pointers = _sizes(frame)
    words += [0] * (data + pointers)
    words[0] = _struct_pointer(0, frame_at, data, pointers)
    field = body.fields[wire_name(member)]
    _set_discriminant(words, frame_at, body, field)
    pointer_at = frame_at + data + field.proto.slot.offset
    node = field.schema
    for name in path:
        at = len(words)
        data, pointers = _sizes(node)
        words += [0] * (data + pointers)
        words[pointer_at] = _struct_pointer(pointer_at, at, data, pointers)
        field = node.fields[wire_name(name)]
        _set_discriminant(words, at, node, field)
        pointer_at = at + data + field.proto.slot.offset
        if field.proto.slot.type.which() == "list":
            break
        node = field.schema
    room = size // 8 - 1 - len(words) - 1  # minus the segment table and a composite list's tag
    element = field.proto.slot.type.list.elementType.which()
    if element == "struct":
        n = 250_000 if count is None else count  # zero words each: any number fits
        at = len(words)
        words.append(n << 2)  # the tag: n elements of 0 data and 0 pointer words
        words[pointer_at] = _list_pointer(pointer_at, at, _COMPOSITE, 0)
    else:
        n = room if count is None else count
        at = len(words)
        words += [0] * n  # null pointers: empty texts
        words[pointer_at] = _list_pointer(pointer_at, at, _POINTER, n)
    words += [0] * max(0, size // 8 - 1 - len(words))  # padding: a bigger frame buys a bigger traversal limit
    return struct.pack("<II", 0, len(words)) + struct.pack(f"<{len(words)}Q", *words)


#: One hostile frame per list-bearing message: ``(member, path to the list)``.
LIST_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("join", ("providers",)),
    ("demandPage", ("items",)),
    ("factCommit", ("fact", "requestIntent", "instanceRefs")),
    ("factCommit", ("fact", "returned", "machineIds")),
    ("resyncRequest", ("providers",)),
    ("resyncPage", ("facts",)),
    ("resyncPage", ("hosts",)),
    ("hostStatePush", ("hosts",)),
    ("adminSetDemand", ("items",)),
)
