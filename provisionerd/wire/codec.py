"""Frame bodies <-> messages: ``encode(msg, corr) -> bytes`` and ``decode(body) -> Envelope``.

Pure and synchronous. The mapping is driven by the attrs fields of each class and the naming rule of the schema
(snake_case here, lowerCamelCase there; class ``LeaseGrant`` is union member ``leaseGrant``), checked once at import
so a class and the schema cannot drift apart silently. How each Python type travels:

    int, float, bool, str          the scalar / Text field of the same name
    enum (Role, HostStatus)        the schema enum whose enumerant names equal the Python values
    str with metadata wire_enum    that schema enum, "stale_epoch" <-> staleEpoch
    X | None                       an Optional* struct (union none/some; a null pointer means none)
    Mapping[str, str]              List(KeyValue), written in key order; a duplicate key is a decode error
    tuple[str, ...]                List(Text)
    tuple[attrs class, ...]        List(struct)
    attrs class (Epoch, ...)       a struct
    Fact                           struct Fact: provider, epoch and opId, then a union of the kinds

``decode`` treats the body as hostile: the reader is bounded (traversal and nesting limits), every list's length
is checked against its cap before an element is read and every struct built is counted against the kind's budget
(``bounds.py``: ``FrameOverBounds``), every field is read inside the ``try``, and whatever is wrong surfaces as
``DecodeError`` (or that subclass) and nothing else. ``peek`` reads only the frame's ``corr`` and kind, so a
receiver refuses what the peer may not send before it pays for the body.
"""

from __future__ import annotations

import enum
import functools
import struct
import sys
import threading
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs
import capnp

from provisionerd import resources
from provisionerd.domain import model
from provisionerd.domain.errors import DecodeError, FrameOverBounds
from provisionerd.wire import bounds, native
from provisionerd.wire.messages import MESSAGE_TYPES, Envelope, Message

SCHEMA_PATH = resources.wire_schema()
#: Deep enough for the schema (Frame > ResyncPage > CommittedFact > Fact > kind > list is 6), far from the default.
NESTING_LIMIT = 16
_FACT_HEADER = ("provider", "epoch", "op_id")


@functools.cache
def schema() -> Any:
    """The loaded ``protocol/provisioner.capnp`` module (pycapnp), found in the installed package
    (``provisionerd.resources``); ``ResourceMissing`` (a ``FileNotFoundError``) when it is not there."""
    return capnp.load(str(resources.require(SCHEMA_PATH)))


def wire_name(name: str) -> str:
    """``protocol_version`` -> ``protocolVersion``; ``LeaseGrant`` -> ``leaseGrant``."""
    head, *rest = name.split("_")
    return head[:1].lower() + head[1:] + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def opcode(msg: object) -> str:
    """The ``Frame.body`` union member that carries ``msg`` (a message or its class), e.g. ``"leaseAcquire"``."""
    cls = msg if isinstance(msg, type) else type(msg)
    return wire_name(cls.__name__)


# --- per-field read/write plans --------------------------------------------------------------------------------

Writer = Callable[[Any, str, Any], None]  # (capnp builder, wire field name, python value)
Reader = Callable[[Any, str], Any]  # (capnp reader, wire field name) -> python value


def _enum_table(enum_name: str) -> dict[int, str]:
    """Schema enum ``enum_name`` as ``{raw value: enumerant name}``; decoding maps raw values itself because
    pycapnp raises a bare RuntimeError for a value the schema lacks."""
    return {raw: name for name, raw in getattr(schema(), enum_name).schema.enumerants.items()}


def _read_enum_name(reader: Any, wire: str, by_raw: dict[int, str]) -> str:
    raw = getattr(reader, wire).raw
    try:
        return by_raw[raw]
    except KeyError:
        raise DecodeError(f"unknown enum value {raw} in field {wire!r}") from None


class _Meter(threading.local):
    """Units left for the frame being decoded on this thread (``decode`` sets it; readers spend it)."""

    left: int = 0
    spent: int = 0


_METER = _Meter()


def _spend(units: int, what: str) -> None:
    _METER.left -= units
    _METER.spent += units
    if _METER.left < 0:
        raise FrameOverBounds(f"frame exceeds its decoding budget at {what}")


@functools.cache
def _schema_field(owner: str, wire: str) -> Any:
    """Field ``wire`` of schema struct ``owner``: what ``_get_by_field`` takes (a lookup by name costs ~2 us)."""
    return getattr(schema(), owner).schema.fields[wire]


def _checked_list(reader: Any, wire: str, owner: str) -> Any:
    """The list reader of field ``wire``, refused on its length alone if above the field's cap."""
    items = reader._get_by_field(_schema_field(owner, wire))
    cap = bounds.list_cap(owner, wire)
    if len(items) > cap:
        raise FrameOverBounds(f"{owner}.{wire} holds {len(items)} elements, at most {cap} allowed")
    return items


def _plan_type(tp: Any, field: attrs.Attribute | None = None, owner: str = "") -> tuple[Writer, Reader]:
    wire_enum = field.metadata.get("wire_enum") if field is not None else None
    if wire_enum:
        by_raw = _enum_table(wire_enum)
        return (
            lambda b, w, v: setattr(b, w, wire_name(v)),
            lambda r, w: _snake(_read_enum_name(r, w, by_raw)),
        )
    if tp in (int, float, bool, str):
        return setattr, getattr
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        by_raw = _enum_table(tp.__name__)
        return (lambda b, w, v: setattr(b, w, tp(v).value), lambda r, w: tp(_read_enum_name(r, w, by_raw)))
    if tp is model.Fact:
        return (lambda b, w, v: _write_fact(b.init(w), v), lambda r, w: _read_fact(getattr(r, w)))
    if attrs.has(tp):
        return (lambda b, w, v: _write_struct(b.init(w), v), lambda r, w: _read_struct(tp, getattr(r, w)))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        return _write_optional, _read_optional
    if origin is Mapping:
        return _write_map, functools.partial(_read_map, owner=owner)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _plan_list(args[0], owner)
    raise TypeError(f"no wire mapping for {tp!r}")


def _write_optional(b: Any, w: str, v: Any) -> None:
    opt = b.init(w)
    if v is None:
        opt.none = None
    else:
        opt.some = v


def _read_optional(r: Any, w: str) -> Any:
    opt = getattr(r, w)
    return opt.some if opt.which() == "some" else None


def _write_map(b: Any, w: str, v: Mapping[str, str]) -> None:
    entries = b.init(w, len(v))
    for entry, (key, value) in zip(entries, sorted(v.items()), strict=True):
        entry.key = key
        entry.value = value


def _read_map(r: Any, w: str, owner: str) -> dict[str, str]:
    """A map's entries, keys and values interned: a fleet's maps (a host's capabilities, a demand item's attributes)
    repeat a few names and values across the thousands of values a view holds, which then share one string each
    (freed, as any, once nothing refers to it: a peer cannot grow what we hold beyond what it makes us hold)."""
    out: dict[str, str] = {}
    entries = _checked_list(r, w, owner)
    _spend(len(entries), f"{owner}.{w}")
    for entry in entries:
        key = sys.intern(entry.key)
        if key in out:
            raise DecodeError(f"duplicate key in map field {w!r}")
        out[key] = sys.intern(entry.value)
    return out


def _plan_list(item: Any, owner: str) -> tuple[Writer, Reader]:
    if item is str:
        return (lambda b, w, v: setattr(b, w, list(v)), lambda r, w: tuple(_checked_list(r, w, owner)))
    if not attrs.has(item):
        raise TypeError(f"no wire mapping for a list of {item!r}")

    def write(b: Any, w: str, v: tuple[Any, ...]) -> None:
        elements = b.init(w, len(v))
        write_one = _struct_writer(item)
        for element, value in zip(elements, v, strict=True):
            write_one(element, value)

    def read(r: Any, w: str) -> tuple[Any, ...]:
        elements = _checked_list(r, w, owner)
        _spend(len(elements), f"{owner}.{w}")  # before the first element: the whole list must fit the budget
        read_one = _struct_reader(item)  # the elements were paid for with the list
        return tuple([read_one(element) for element in elements])

    return write, read


@functools.cache
def _plan(cls: type, skip: tuple[str, ...] = ()) -> tuple[tuple[str, str, Writer, Reader], ...]:
    """``(attr name, wire name, writer, reader)`` for each field of ``cls`` (minus ``skip``)."""
    attrs.resolve_types(cls)
    return tuple(
        (f.name, wire_name(f.name), *_plan_type(f.type, f, cls.__name__))
        for f in attrs.fields(cls)
        if f.name not in skip
    )


def _write_struct(builder: Any, value: Any, skip: tuple[str, ...] = ()) -> None:
    cls: type = type(value)  # typed as a plain class: mypy does not see a type[Any] as Hashable (the cache key)
    _struct_writer(cls, skip)(builder, value)


def _read_struct(cls: type, reader: Any, skip: tuple[str, ...] = (), counted: bool = False, **extra: Any) -> Any:
    if not counted:  # a list's elements were paid for with the list
        _spend(1, cls.__name__)
    return _struct_reader(cls, skip)(reader, **extra)


# --- the fast path -----------------------------------------------------------------------------------------------
# Each class's plan is compiled once into one straight-line function (``_compile``). A plain scalar field costs one
# ``_get_by_field`` / ``_set_by_field`` with the schema's field object (~0.16 us, where pycapnp's attribute access
# by name costs ~1.2-2 us: it looks the name up in the schema every time), and a struct or fact field is reached the
# same way; enums, lists, maps and optionals go through their reader or writer of ``_plan_type``, with every cap and
# unit charge as before. Measured on a 1 KB ResyncPage (bench/wire.py): decode ~72 -> ~13 us, encode ~37 -> ~8 us.


#: Text fields whose values repeat across many facts (a few providers, templates and demand items; an op's id on
#: each of its machines): decoded as one shared (interned) string each, not one copy per fact. Interned strings are
#: freed like any other once nothing refers to them, so a peer cannot grow the table beyond what it makes us hold.
_SHARED_TEXT = frozenset({"provider", "op_id", "template_id", "demand_id"})


def _compile(name: str, source: str, env: dict[str, Any]) -> Callable[..., Any]:
    exec(compile(source, f"<codec {name}>", "exec"), env)  # noqa: S102 - made from the schema's own field names
    fn: Callable[..., Any] = env[name]
    return fn


def _field_kind(cls: type, name: str) -> str:
    """How ``_plan_type`` maps the field: ``scalar``, ``struct``, ``fact`` or ``other`` (its own reader/writer)."""
    field = attrs.fields_dict(cls)[name]
    tp = field.type
    if field.metadata.get("wire_enum"):
        return "other"
    if tp in (int, float, bool, str):
        return "scalar"
    if tp is model.Fact:
        return "fact"
    if isinstance(tp, type) and attrs.has(tp):
        return "struct"
    return "other"


def _field_reads(cls: type, skip: tuple[str, ...], env: dict[str, Any]) -> list[str]:
    """``name=<expression reading it from r>`` per field of ``cls`` minus ``skip``; fills ``env``."""
    fields = getattr(schema(), cls.__name__).schema.fields
    env.update(read_struct=_read_struct, read_fact=_read_fact, intern=sys.intern)
    args = []
    for i, (name, wire, _, read) in enumerate(_plan(cls, skip)):
        env[f"f{i}"], kind = fields[wire], _field_kind(cls, name)
        if kind == "scalar" and name in _SHARED_TEXT:
            args.append(f"{name}=intern(r._get_by_field(f{i}))")
        elif kind == "scalar":
            args.append(f"{name}=r._get_by_field(f{i})")
        elif kind == "struct":
            env[f"t{i}"] = attrs.fields_dict(cls)[name].type
            args.append(f"{name}=read_struct(t{i}, r._get_by_field(f{i}))")
        elif kind == "fact":
            args.append(f"{name}=read_fact(r._get_by_field(f{i}))")
        else:
            env[f"read{i}"] = read
            args.append(f"{name}=read{i}(r, {wire!r})")
    return args


@functools.cache
def _struct_reader(cls: type, skip: tuple[str, ...] = ()) -> Callable[..., Any]:
    """``read(reader, **extra) -> cls`` for ``cls`` minus ``skip``, not counting the struct itself."""
    env: dict[str, Any] = {"cls": cls}
    args = [*_field_reads(cls, skip, env), "**extra"]
    return _compile("read", f"def read(r, **extra):\n    return cls({', '.join(args)})\n", env)


def _field_writes(cls: type, skip: tuple[str, ...], env: dict[str, Any]) -> list[str]:
    fields = getattr(schema(), cls.__name__).schema.fields
    env.update(write_struct=_write_struct, write_fact=_write_fact)
    lines = []
    for i, (name, wire, write, _) in enumerate(_plan(cls, skip)):
        env[f"f{i}"], kind = fields[wire], _field_kind(cls, name)
        if kind == "scalar":
            lines.append(f"    b._set_by_field(f{i}, v.{name})")
        elif kind == "struct":
            lines.append(f"    write_struct(b._init_by_field(f{i}), v.{name})")
        elif kind == "fact":
            lines.append(f"    write_fact(b._init_by_field(f{i}), v.{name})")
        else:
            env[f"write{i}"] = write
            lines.append(f"    write{i}(b, {wire!r}, v.{name})")
    return lines


@functools.cache
def _struct_writer(cls: type, skip: tuple[str, ...] = ()) -> Callable[[Any, Any], None]:
    """``write(builder, value)`` for ``cls`` minus ``skip``."""
    env: dict[str, Any] = {}
    lines = _field_writes(cls, skip, env) or ["    pass"]
    return _compile("write", "def write(b, v):\n" + "\n".join(lines) + "\n", env)


_FACT_BY_MEMBER: dict[str, type] = {wire_name(cls.__name__): cls for cls in model.FACT_TYPES}
_MESSAGE_BY_MEMBER: dict[str, type] = {opcode(cls): cls for cls in MESSAGE_TYPES}
_MEMBER_BY_MESSAGE: dict[type, str] = {cls: member for member, cls in _MESSAGE_BY_MEMBER.items()}


def _spend_fact(units: int, what: str) -> None:
    _spend(units, what)  # looked up at each call, as every other charge is (tests count the charges)


@functools.cache
def _fact_reader(member: str) -> Callable[[Any], Any]:
    """``read(Fact reader) -> fact`` of union member ``member``: one struct (its unit), the header fields read from
    the ``Fact`` struct and the kind's own from its member."""
    cls = _FACT_BY_MEMBER[member]
    env: dict[str, Any] = {}
    header = _header_reads(cls, env)
    env.update(
        body=_struct_reader(cls, _FACT_HEADER),
        spend=_spend_fact,
        what=cls.__name__,
        kind=schema().Fact.schema.fields[member],
    )
    source = f"def read(r):\n    spend(1, what)\n    return body(r._get_by_field(kind), {', '.join(header)})\n"
    return _compile("read", source, env)


def _header_reads(cls: type, env: dict[str, Any]) -> list[str]:
    """The header fields (provider, epoch, op_id) of a fact of ``cls``, read from the ``Fact`` struct."""
    fields = schema().Fact.schema.fields
    env.update(read_struct=_read_struct, intern=sys.intern)
    args = []
    for i, (name, wire, _, read) in enumerate(p for p in _plan(cls) if p[0] in _FACT_HEADER):
        env[f"h{i}"], kind = fields[wire], _field_kind(cls, name)
        if kind == "scalar" and name in _SHARED_TEXT:
            args.append(f"{name}=intern(r._get_by_field(h{i}))")
        elif kind == "scalar":
            args.append(f"{name}=r._get_by_field(h{i})")
        elif kind == "struct":
            env[f"ht{i}"] = attrs.fields_dict(cls)[name].type
            args.append(f"{name}=read_struct(ht{i}, r._get_by_field(h{i}))")
        else:
            env[f"hread{i}"] = read
            args.append(f"{name}=hread{i}(r, {wire!r})")
    return args


@functools.cache
def _fact_writer(cls: type) -> Callable[[Any, Any], None]:
    fields = schema().Fact.schema.fields
    env: dict[str, Any] = {"body": _struct_writer(cls, _FACT_HEADER), "kind": fields[wire_name(cls.__name__)]}
    env.update(write_struct=_write_struct)
    lines = []
    for i, (name, wire, write, _) in enumerate(p for p in _plan(cls) if p[0] in _FACT_HEADER):
        env[f"h{i}"], kind = fields[wire], _field_kind(cls, name)
        if kind == "scalar":
            lines.append(f"    b._set_by_field(h{i}, v.{name})")
        elif kind == "struct":
            lines.append(f"    write_struct(b._init_by_field(h{i}), v.{name})")
        else:
            env[f"hwrite{i}"] = write
            lines.append(f"    hwrite{i}(b, {wire!r}, v.{name})")
    lines.append("    body(b._init_by_field(kind), v)")
    return _compile("write", "def write(b, v):\n" + "\n".join(lines) + "\n", env)


def _write_fact(builder: Any, fact: Any) -> None:
    cls: type = type(fact)
    if cls not in model.FACT_TYPES:
        raise TypeError(f"not a fact: {cls.__name__}")
    _fact_writer(cls)(builder, fact)


def _read_fact(reader: Any) -> Any:
    return _fact_reader(reader.which())(reader)


# --- the native path ---------------------------------------------------------------------------------------------
# ``wire/native.py`` loads the optional extension (rust/fastwire); these plans tell it the same mapping as above,
# as numbers: per class, in attrs field order, each field's kind, where it sits (a data offset in units of its
# size, or a pointer index), the plan of what it holds, its list cap, its enum table. The extension builds the
# values positionally; a fact's header fields are read from the ``Fact`` struct (``outer``), the rest from its
# member. Whatever the extension refuses is decoded by the reference path below, which gives the answer.

_N_SCALAR = {"bool": 0, "uint32": 1, "uint64": 2, "int32": 3, "float64": 4, "text": 5}
_N_TEXT_INTERN, _N_STRUCT, _N_ENUM, _N_OPT_TEXT, _N_OPT_F64 = 6, 7, 8, 9, 10
_N_MAP, _N_LIST_TEXT, _N_LIST_STRUCT, _N_FACT = 11, 12, 13, 14


class _NativePlans:
    """The extension's plan tables, compiled once from the classes and the schema."""

    def __init__(self) -> None:
        self.plans: list[tuple[type, int, int, list[dict[str, Any]], bool, bool, bool]] = []
        self.index: dict[type, int] = {}
        self.facts: list[tuple[int, int, int, dict[int, tuple[int, int]], dict[type, int]]] = []

    def struct(self, cls: type) -> int:
        if cls in self.index:
            return self.index[cls]
        self.index[cls] = len(self.plans)
        fields: list[dict[str, Any]] = []
        node = getattr(schema(), cls.__name__).schema.node.struct
        self.plans.append(
            (cls, node.dataWordCount, node.pointerCount, fields, False, False, False)
        )  # its index, for recursion
        is_fact = cls in model.FACT_TYPES
        own = getattr(schema(), cls.__name__).schema.fields
        header = schema().Fact.schema.fields
        for name, wire, _, _ in _plan(cls):
            outer = is_fact and name in _FACT_HEADER
            fields.append(self._field(cls, name, (header if outer else own)[wire], outer))
        share, raw_new = _shareable(cls, fields), _stores_only(cls)
        slots = _generic_attributes(cls) and all(f["slot"] is not None for f in fields)
        self.plans[self.index[cls]] = (cls, node.dataWordCount, node.pointerCount, fields, share, raw_new, slots)
        return self.index[cls]

    def _field(self, cls: type, name: str, field: Any, outer: bool) -> dict[str, Any]:
        attr = attrs.fields_dict(cls)[name]
        tp: Any = attr.type  # resolved by _plan
        slot, kind = field.proto.slot, _field_kind(cls, name)
        out: dict[str, Any] = {
            "kind": 0, "outer": outer, "offset": slot.offset, "plan": 0, "cap": 0, "table": [], "raw": {},
            "opt_disc": 0, "opt_some": 0, "opt_none": 0, "words": (0, 0), "name": sys.intern(name),
            "slot": _slot(cls, name),
        }  # fmt: skip
        which = slot.type.which()
        wire_enum = attr.metadata.get("wire_enum")
        if wire_enum or (isinstance(tp, type) and issubclass(tp, enum.Enum)):
            by_raw = _enum_table(wire_enum or tp.__name__)
            convert: Callable[[str], Any] = _snake if wire_enum else tp
            table = [convert(by_raw[raw]) if raw in by_raw else None for raw in range(max(by_raw) + 1)]
            raw_of = {value: raw for raw, value in enumerate(table) if value is not None}
            if not wire_enum:  # the reference writes tp(v).value: a member or its value
                raw_of.update({value.value: raw for value, raw in list(raw_of.items())})
            return out | {"kind": _N_ENUM, "table": table, "raw": raw_of}
        if kind == "scalar":
            code = _N_TEXT_INTERN if which == "text" and name in _SHARED_TEXT else _N_SCALAR[which]
            return out | {"kind": code}
        if kind == "struct":
            return out | {"kind": _N_STRUCT, "plan": self.struct(tp)}
        if kind == "fact":
            return out | {"kind": _N_FACT, "plan": self.fact()}
        owner, wire = cls.__name__, wire_name(name)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (types.UnionType, typing.Union):
            node = field.schema.node.struct
            some = field.schema.fields["some"].proto
            code = _N_OPT_TEXT if some.slot.type.which() == "text" else _N_OPT_F64
            if code == _N_OPT_TEXT and some.slot.offset != 0:
                raise TypeError(f"{owner}.{wire}: an optional's text is read from pointer 0")
            sizes = (node.dataWordCount, node.pointerCount)
            none = field.schema.fields["none"].proto.discriminantValue
            optional = {"opt_disc": node.discriminantOffset, "opt_some": some.discriminantValue, "opt_none": none}
            optional["words"] = sizes
            return out | {"kind": code, "cap": some.slot.offset} | optional
        cap = bounds.list_cap(owner, wire)
        if origin is Mapping:
            entry = schema().KeyValue.schema
            if (entry.fields["key"].proto.slot.offset, entry.fields["value"].proto.slot.offset) != (0, 1):
                raise TypeError("KeyValue is read as key at pointer 0, value at pointer 1")
            sizes = (entry.node.struct.dataWordCount, entry.node.struct.pointerCount)
            return out | {"kind": _N_MAP, "cap": cap, "words": sizes}
        if args[0] is str:
            return out | {"kind": _N_LIST_TEXT, "cap": cap}
        return out | {"kind": _N_LIST_STRUCT, "plan": self.struct(args[0]), "cap": cap}

    def fact(self) -> int:
        if not self.facts:
            node = schema().Fact.schema.node.struct
            members: dict[int, tuple[int, int]] = {}
            by_class: dict[type, int] = {}
            self.facts.append((node.discriminantOffset, node.dataWordCount, node.pointerCount, members, by_class))
            fields = schema().Fact.schema.fields
            for member, cls in _FACT_BY_MEMBER.items():
                proto = fields[member].proto
                members[proto.discriminantValue] = (proto.slot.offset, self.struct(cls))
                by_class[cls] = proto.discriminantValue
        return 0

    def frame(
        self,
    ) -> tuple[int, int, tuple[int, int], dict[int, tuple[int, int, int, int]], dict[type, int], dict[int, str]]:
        corr_field, body_field, members = _frame_fields()
        out, by_class, names = {}, {}, {}
        for member, cls in _MESSAGE_BY_MEMBER.items():
            proto = members[member].proto
            named = bounds.MAX_BODY_BYTES.get(member, -1)  # -1: the frame limit alone
            out[proto.discriminantValue] = (proto.slot.offset, self.struct(cls), bounds.max_units(member), named)
            by_class[cls] = proto.discriminantValue
            names[proto.discriminantValue] = sys.intern(member)  # the key of bounds.MAX_UNITS, read at each frame
        node = schema().Frame.schema.node.struct
        disc = body_field.schema.node.struct.discriminantOffset
        return corr_field.proto.slot.offset, disc, (node.dataWordCount, node.pointerCount), out, by_class, names


def _slot(cls: type, name: str) -> Any:
    """The member descriptor (a slot) that ``getattr(value, name)`` finds for a ``cls`` value, or None when it finds
    something else (a class without slots, a property): the native codec then reads and writes the field by name."""
    for klass in cls.__mro__:
        if name in vars(klass):
            found = vars(klass)[name]
            return found if type(found) is types.MemberDescriptorType else None
    return None


def _generic_attributes(cls: type) -> bool:
    """Whether ``cls`` finds its attributes the generic way (``object.__getattribute__``, no ``__getattr__``): then
    reading a slot's descriptor is what ``getattr`` does, less the lookup of its name."""
    return cls.__getattribute__ is object.__getattribute__ and not hasattr(cls, "__getattr__")


def _stores_only(cls: type) -> bool:
    """Whether ``cls``'s ``__init__`` only stores its arguments for what the codec hands it (each field given,
    no validator, no pre- or post-init, every converter returning a tuple as it is): then the native codec makes
    the value without calling it, as ``object.__new__`` and ``object.__setattr__`` would."""
    params = getattr(cls, "__attrs_attrs__", ())
    if not params or hasattr(cls, "__attrs_post_init__") or hasattr(cls, "__attrs_pre_init__"):
        return False
    sample = (object(),)
    for a in params:
        if a.validator is not None or not a.init or a.alias != a.name:
            return False
        if a.converter is not None and not (callable(a.converter) and a.converter(sample) is sample):
            return False
    return getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"


def _shareable(cls: type, fields: list[dict[str, Any]]) -> bool:
    """Whether equal bytes may decode to one shared ``cls`` value: a frozen class of scalars and texts only, with
    no validator, converter or post-init to run per value (``Epoch``, ``PriceQuote``)."""
    params = getattr(cls, "__attrs_attrs__", ())
    plain = all(a.validator is None and a.converter is None for a in params)
    frozen = getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"  # @attrs.frozen
    small = all(f["kind"] <= _N_TEXT_INTERN and not f["outer"] for f in fields)
    message = cls in MESSAGE_TYPES  # a frame's own message is seldom repeated: it would only churn the memo
    return plain and frozen and small and not message and not hasattr(cls, "__attrs_post_init__")


@functools.cache
def _native_codec() -> tuple[Any, type[BaseException]] | None:
    """The extension's codec and its ``Refused``, or None when the extension is not there (``native.load``)."""
    module = native.load()
    if module is None:
        return None
    plans = _NativePlans()
    frame = plans.frame()
    envelope = (Envelope, _stores_only(Envelope))
    made = module.Codec(plans.plans, plans.facts, frame, envelope, types.MemberDescriptorType, bounds)
    return made, module.Refused


#: How many frames the native codec handed back to the reference path since the process started: bodies it did
#: not read (malformed, over a bound, a layout it does not read) and values it did not write (out of range, not
#: the declared type).
NATIVE_HANDED_BACK = [0]


# --- the public pair -------------------------------------------------------------------------------------------


@functools.cache
def _frame_fields() -> tuple[Any, Any, dict[str, Any]]:
    """``Frame.corr``, ``Frame.body`` and the body's union members, as schema field objects."""
    fields = schema().Frame.schema.fields
    return fields["corr"], fields["body"], dict(fields["body"].schema.fields)


def encode(msg: Message, corr: int = 0) -> bytes:
    """The frame body (unpacked, standard serialization) carrying ``msg`` with correlation id ``corr``.

    Raises:
        TypeError: ``msg`` is not a wire message (or holds a value of the wrong type).
        ValueError: a value does not fit its wire field (negative or too large an integer, a lone surrogate).
    """
    fast = _native_codec()
    if fast is not None:
        codec, refused = fast
        try:
            body: bytes = codec.encode(msg, corr)
            return body
        except refused:  # a value the reference path must judge (or a layout it writes otherwise)
            NATIVE_HANDED_BACK[0] += 1
    return encode_reference(msg, corr)


def framed_writer() -> (
    tuple[Callable[[Message, int, int], bytes], Callable[[list[tuple[Message, int]], int], bytes], type[BaseException]]
    | None
):
    """The native codec's ``encode_framed(msg, corr, max_frame)`` (the frame header and body written at once),
    its ``encode_framed_many(items, max_frame)`` (``encode_framed`` of each ``(msg, corr)`` of a list, joined) and
    the ``Refused`` they raise for what they do not write (a body above ``max_frame`` included: then ``encode`` and
    the caller's checks decide), or None when the native codec is not there. A ``FramedStream`` keeps them."""
    fast = _native_codec()
    return None if fast is None else (fast[0].encode_framed, fast[0].encode_framed_many, fast[1])


def encode_framed_native(msg: Message, corr: int, max_frame: int) -> bytes | None:
    """The frame header and body for ``msg`` written at once by the native codec (``framed_writer``), or None when
    it is not there or does not write this one."""
    writer = framed_writer()
    if writer is None:
        return None
    try:
        return writer[0](msg, corr, max_frame)
    except writer[2]:
        return None


def encode_reference(msg: Message, corr: int = 0) -> bytes:
    """``encode`` through pycapnp alone: the reference the native writer is checked against."""
    member = opcode(msg)
    if _MESSAGE_BY_MEMBER.get(member) is not type(msg):
        raise TypeError(f"not a wire message: {type(msg).__name__}")
    corr_field, body_field, members = _frame_fields()
    frame = schema().Frame.new_message()
    try:
        frame._set_by_field(corr_field, corr)
        _write_struct(frame._get_by_field(body_field)._init_by_field(members[member]), msg)
        return frame.to_bytes()
    except (capnp.KjException, OverflowError, UnicodeError) as exc:
        raise ValueError(f"cannot encode {type(msg).__name__}: {exc}") from None


#: Everything pycapnp or our own checks raise for malformed input: KjException from the reader, ValueError for a
#: length not a multiple of 8 or bad UTF-8, RuntimeError for an enumerant the schema lacks, and the rest from
#: building the attrs value (a validator, an unknown union member).
_MALFORMED = (capnp.KjException, ValueError, RuntimeError, TypeError, KeyError, IndexError, OverflowError)


@attrs.frozen
class FrameHead:
    """What ``peek`` reads of a frame without touching its body: the correlation id and the message kind."""

    corr: int
    member: str  # the Frame.body union member, e.g. "adminSetDemand"
    kind: type  # its message class


def _check_length(body: bytes) -> None:
    if len(body) % 8 or not body:
        raise DecodeError(f"frame body of {len(body)} bytes is not a whole number of 8-byte words")


#: ``peek`` reads the root pointer and Frame's own two data words and one pointer, nothing below them.
_PEEK_TRAVERSAL_WORDS = 16


def peek(body: bytes) -> FrameHead:
    """The frame's ``corr`` and kind, in constant time whatever the body holds. Raises ``DecodeError`` for a body
    that is not a ``Frame`` or names a kind this side does not know."""
    _check_length(body)
    try:
        with schema().Frame.from_bytes(
            body, traversal_limit_in_words=_PEEK_TRAVERSAL_WORDS, nesting_limit=NESTING_LIMIT
        ) as root:
            corr = root.corr
            member = root.body.which()
    except _MALFORMED as exc:
        raise DecodeError(f"malformed frame body: {type(exc).__name__}: {_first_line(exc)}") from None
    try:
        return FrameHead(corr, member, _MESSAGE_BY_MEMBER[member])
    except KeyError:
        raise DecodeError(f"unknown frame kind {member!r}") from None


#: Enough of a body for ``peek_prefix`` when it is laid out as writers lay it out: the segment table (8 bytes), the
#: root pointer (8) and Frame's two data words (16), with room for a few words of padding.
PREFIX_BYTES = 64
_WORD = struct.Struct("<Q")


@functools.cache
def _member_by_discriminant() -> dict[int, str]:
    body = schema().Frame.schema.fields["body"].schema
    return {f.proto.discriminantValue: name for name, f in body.fields.items()}


@functools.cache
def _discriminant_word_and_shift() -> tuple[int, int]:
    offset = schema().Frame.schema.fields["body"].schema.node.struct.discriminantOffset  # in 16-bit units
    return offset // 4, (offset % 4) * 16


def peek_prefix(prefix: bytes) -> FrameHead | None:
    """``peek`` from the first bytes of a body, or None when they do not settle it (more than one segment, a root
    struct that is not right there, a kind this side does not know): then ``peek`` the whole body.

    Reads what a Cap'n Proto reader would: the segment table's count, the root struct pointer, and ``corr`` and the
    union discriminant in Frame's data section. Only a single-segment body whose root struct's first two data
    words lie within ``prefix`` is answered, so nothing is read as a default that the full reader would find.
    """
    if len(prefix) < 16 or int.from_bytes(prefix[:4], "little") != 0:
        return None
    pointer = _WORD.unpack_from(prefix, 8)[0]
    offset = (pointer >> 2) & 0x3FFFFFFF
    data_words = (pointer >> 32) & 0xFFFF
    word, shift = _discriminant_word_and_shift()
    if pointer & 3 or offset & 0x20000000 or data_words <= word:  # not a struct, a negative offset, too small
        return None
    start = 8 + 8 * (1 + offset)  # the struct follows the root pointer by ``offset`` words
    if start + 8 * (word + 1) > len(prefix):
        return None
    corr = _WORD.unpack_from(prefix, start)[0]
    discriminant = (_WORD.unpack_from(prefix, start + 8 * word)[0] >> shift) & 0xFFFF
    member = _member_by_discriminant().get(discriminant)
    if member is None or member not in _MESSAGE_BY_MEMBER:
        return None
    return FrameHead(corr, member, _MESSAGE_BY_MEMBER[member])


def decode(body: bytes) -> Envelope:
    """Parse one frame body. Any byte string either decodes or raises ``DecodeError``; work is bounded by its size
    and by the caps of ``bounds.py`` (``FrameOverBounds``, checked on each list's length before its elements).

    The traversal limit is twice the body's size in words (a well-formed message reads each word once), which
    stops amplification through overlapping pointers; lists of empty elements, cheap in words, are stopped by the
    list caps and the unit budget.
    """
    return decode_metered(body)[0]


def decode_metered(body: bytes) -> tuple[Envelope, int]:
    """``decode``, and the units it spent (what a per-connection decode budget charges): the native reader's
    answer when it gives one, else the reference path's."""
    _check_length(body)
    fast = _native_codec()
    if fast is not None:
        codec, refused = fast
        try:
            envelope, units = codec.decode(body, _traversal_words(body))
            # the plans hold the caps of when they were compiled; the frame's budget is read now (as the
            # reference path reads it), and a frame over it is the reference path's to refuse
            if units <= bounds.max_units(_MEMBER_BY_MESSAGE[type(envelope.msg)]):
                return envelope, units
        except (refused, *_MALFORMED):
            NATIVE_HANDED_BACK[0] += 1
    return decode_reference(body)


def framed_reader() -> (
    tuple[
        Callable[[bytes | bytearray, Collection[type], int], tuple[Envelope, int, int] | None],
        tuple[type[BaseException], ...],
    ]
    | None
):
    """The native codec's ``decode_framed(data, allowed, max_frame)`` and the exceptions by which it declines a frame
    (its ``Refused``, and what building a value may raise), or None when the native codec is not there:
    ``decode_framed_native`` is the two together. A ``FramedStream`` keeps them, and calls the reader in place."""
    fast = _native_codec()
    return None if fast is None else (fast[0].decode_framed, (fast[1], *_MALFORMED))


def decode_framed_native(
    data: bytes | bytearray, allowed: Collection[type], max_frame: int
) -> tuple[Envelope, int, int] | None:
    """``(envelope, units, end)`` for the frame at the start of ``data`` (its header and body as a link received
    them, maybe more after it; ``end`` is where it ends), decoded as ``decode_metered`` decodes its body, by the
    native codec in one call, which first checks on the frame's head that its kind is in ``allowed`` and its length
    within its kind's bound (``bounds.max_body_bytes`` for ``max_frame``), and charges it against its kind's unit
    budget as ``bounds`` has it now (``bounds.max_units``). None when ``data`` does not hold the whole frame, its
    header says more than ``max_frame``, or the native codec is not there or does not answer (any refusal, a check
    above included): the caller's reference path then checks and decodes the frame and gives the typed error. A
    ``bytes`` is read where it is; a ``bytearray`` is copied first."""
    reader = framed_reader()
    if reader is None:
        return None
    decode_framed, declined = reader
    try:  # the native reader refuses a body that is not a whole number of words (``_check_length``)
        return decode_framed(data, allowed, max_frame)
    except declined:
        return None


def _traversal_words(body: bytes) -> int:
    return 2 * (len(body) // 8) + 64


def decode_reference(body: bytes) -> tuple[Envelope, int]:
    """``decode_metered`` through pycapnp alone: the reference the native reader is checked against."""
    _check_length(body)
    try:
        with schema().Frame.from_bytes(
            body, traversal_limit_in_words=_traversal_words(body), nesting_limit=NESTING_LIMIT
        ) as root:
            corr_field, body_field, members = _frame_fields()
            corr = root._get_by_field(corr_field)
            body_reader = root._get_by_field(body_field)
            member = body_reader.which()
            cls = _MESSAGE_BY_MEMBER[member]
            _METER.left, _METER.spent = bounds.max_units(member), 0
            msg = _read_struct(cls, body_reader._get_by_field(members[member]))
    except DecodeError:
        raise
    except _MALFORMED as exc:
        raise DecodeError(f"malformed frame body: {type(exc).__name__}: {_first_line(exc)}") from None
    return Envelope(corr, msg), _METER.spent


def _first_line(exc: BaseException) -> str:
    # KjException messages carry a multi-line C++ stack trace; the first line says what was wrong.
    return str(exc).splitlines()[0][:200] if str(exc) else ""


def _self_check() -> None:
    """Fail at import if a class and the schema disagree on a name, rather than on the first frame that uses it."""
    sch = schema()
    structs = [*MESSAGE_TYPES, model.Epoch, model.ResourceShape, model.DemandItem, model.HostState]
    checks = [(cls, ()) for cls in structs] + [(cls, _FACT_HEADER) for cls in model.FACT_TYPES]
    checks += [(model.CommittedFact, ())]
    for cls, skip in checks:
        fields = getattr(sch, cls.__name__).schema.fields
        missing = [wire for _, wire, _, _ in _plan(cls, skip) if wire not in fields]
        if missing:
            raise TypeError(f"schema struct {cls.__name__} lacks fields {missing}")
    frame = sch.Frame.new_message()
    for member in [*_MESSAGE_BY_MEMBER, *_FACT_BY_MEMBER]:
        target = frame.body if member in _MESSAGE_BY_MEMBER else frame.body.init("factCommit").init("fact")
        target.init(member)  # raises if the union has no such member


_self_check()
