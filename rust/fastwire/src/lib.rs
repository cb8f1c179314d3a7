//! provisionerd's native reader for wire frames: a Cap'n Proto frame body -> the attrs message it carries.
//!
//! It knows nothing of the schema by itself. `provisionerd/wire/native.py` compiles, from the loaded schema and
//! the attrs classes, one plan per struct (which field sits where, as what kind, built into which class) and
//! hands the plans to `Decoder`. The reader then follows the Cap'n Proto encoding spec on the bytes directly:
//! segment table, struct and list pointers, far pointers and their landing pads, with every offset checked
//! against its segment, a traversal budget in words (as the C++ reader's) and a nesting limit.
//!
//! It is only ever a faster path: whatever it does not accept, for any reason (malformed input, a layout it
//! does not read, a list above its cap, the unit budget spent, an error building a value), it raises `Refused`
//! and the caller decodes the frame with the reference codec (pycapnp), which gives the answer: the value, or
//! the typed error. So native and reference can only differ by native accepting what the reference refuses,
//! and the differential tests (tests/wire/test_native.py) look for exactly that.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyString, PyTuple};
use pyo3::Borrowed;

create_exception!(
    _fastwire,
    Refused,
    PyException,
    "The native reader does not answer for this frame."
);

// Field kinds: the numbers provisionerd/wire/native.py uses.
const K_BOOL: u8 = 0;
const K_U32: u8 = 1;
const K_U64: u8 = 2;
const K_I32: u8 = 3;
const K_F64: u8 = 4;
const K_TEXT: u8 = 5;
const K_TEXT_INTERN: u8 = 6;
const K_STRUCT: u8 = 7;
const K_ENUM: u8 = 8;
const K_OPT_TEXT: u8 = 9;
const K_OPT_F64: u8 = 10;
const K_MAP: u8 = 11;
const K_LIST_TEXT: u8 = 12;
const K_LIST_STRUCT: u8 = 13;
const K_FACT: u8 = 14;

const NESTING_LIMIT: u32 = 16;

fn refused(why: &str) -> PyErr {
    Refused::new_err(why.to_string())
}

type R<T> = PyResult<T>;

#[derive(FromPyObject)]
struct Field {
    #[pyo3(item)]
    kind: u8,
    #[pyo3(item)]
    outer: bool, // read from / written to the enclosing Fact struct (a fact's header), not the member
    #[pyo3(item)]
    offset: u32, // data offset in units of the field's size, or the pointer index
    #[pyo3(item)]
    plan: usize, // struct kinds: the plan of the element / struct; K_FACT: the fact plan
    #[pyo3(item)]
    cap: u64, // list kinds: at most this many elements; K_OPT_F64: the offset of `some`
    #[pyo3(item)]
    table: Vec<Option<PyObject>>, // K_ENUM: raw value -> Python value
    #[pyo3(item)]
    raw: Py<PyDict>, // K_ENUM: Python value -> raw value
    #[pyo3(item)]
    opt_disc: u32, // K_OPT_*, K_MAP: the Optional struct's discriminant offset (16-bit units)
    #[pyo3(item)]
    opt_some: u16, // K_OPT_*: the discriminant of `some`
    #[pyo3(item)]
    opt_none: u16, // K_OPT_*: the discriminant of `none`
    #[pyo3(item)]
    words: (u16, u16), // K_OPT_*: the Optional struct's size; K_MAP: KeyValue's (data words, pointers)
    #[pyo3(item)]
    name: Py<PyString>, // the attribute
    #[pyo3(item)]
    slot: Option<PyObject>, // the class's member descriptor of `name` (a slot), or None: then by name
}

struct Plan {
    cls: PyObject,
    dw: u16,
    pc: u16,
    fields: Vec<Field>,
    share: bool, // a small value (scalars and texts only, no validators): decoded once, then shared (`Codec.memo`)
    raw_new: bool, // made as `object.__new__` and `object.__setattr__` would (nothing to run in its `__init__`)
    /// Every field has its `slot` and the class finds attributes the generic way: read and written through the
    /// descriptors (or straight from the value, `offsets`), not looked up by name.
    slots: bool,
    /// With `slots`: where each field's slot sits in a value of `cls` (bytes from its start; `slot_offset`), or 0
    /// where that could not be confirmed: that field then goes through its descriptor.
    offsets: Vec<isize>,
}

/// The codec's caches (`Codec::memo`, `Codec::interned`, `Codec::scratch`), reached only with the GIL held: a
/// `RefCell` behind it, where a `Mutex` cost two atomic operations a lookup (about 6% of a decode). Each borrow
/// ends before any Python code may run (a value dropped out of one is dropped after the borrow), so no call that
/// re-enters the codec finds one still borrowed.
type Held<T> = pyo3::sync::GILProtected<std::cell::RefCell<T>>;

fn held<T>(value: T) -> Held<T> {
    pyo3::sync::GILProtected::new(std::cell::RefCell::new(value))
}

/// Slots of `Codec::interned` and the longest text it keeps (`Codec::interned`).
const INTERNED_SLOTS: usize = 256;
const INTERNED_KEY_MAX: usize = 64;

/// FNV-1a: a slot of `Codec::interned` (direct-mapped, so a colliding key costs one comparison, never a chain).
fn fnv1a(bytes: &[u8]) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h as usize
}

/// A slot of `Codec::memo` for a key: a hash of its bytes a word at a time (a key is mostly whole data words), mixed
/// so that every byte moves the low bits. Direct-mapped as `Codec::interned`: whatever a peer sends, a lookup is one
/// comparison, and a colliding key only replaces the value in its slot.
fn memo_slot(bytes: &[u8]) -> usize {
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h ^ (h >> 32)) as usize % MEMO_SLOTS
}

/// Slots of `Codec::memo`: at most this many shared values are kept (a peer cannot grow it).
const MEMO_SLOTS: usize = 4096;
/// Text fields a shared value may have (`Plan.share`): their bytes are kept on the stack while the key is made.
const MEMO_TEXTS: usize = 8;
/// Only values whose key (data words and texts) is at most this long are shared.
const MEMO_KEY_MAX: usize = 256;

/// A `Codec::memo` key being made: at most `MEMO_KEY_MAX` bytes, kept on the stack; longer, it is no key.
struct MemoKey {
    bytes: [u8; MEMO_KEY_MAX],
    len: usize, // past MEMO_KEY_MAX: too long
}

impl MemoKey {
    fn new() -> Self {
        MemoKey {
            bytes: [0; MEMO_KEY_MAX],
            len: 0,
        }
    }

    #[inline]
    fn push(&mut self, more: &[u8]) {
        let end = self.len.saturating_add(more.len());
        if end <= MEMO_KEY_MAX {
            self.bytes[self.len..end].copy_from_slice(more);
        }
        self.len = end;
    }

    /// The key, or None when it is too long to be one.
    fn get(&self) -> Option<&[u8]> {
        (self.len <= MEMO_KEY_MAX).then(|| &self.bytes[..self.len])
    }
}

struct FactPlan {
    disc_offset: u32,
    dw: u16,
    pc: u16,
    members: Vec<Option<(u32, usize)>>, // discriminant -> (pointer index in Fact, plan)
    by_class: ByType,                   // class -> discriminant
}

/// A `{class: discriminant}` dict's entries, which the writer finds a value's own class in by its address (a value
/// of a subclass is not found, as in the dict), with no hashing and no reference taken to the class or the number.
struct ByType(Vec<(PyObject, usize)>);

impl ByType {
    fn of(by_class: &Bound<'_, PyDict>) -> PyResult<Self> {
        let mut entries = Vec::with_capacity(by_class.len());
        for (cls, disc) in by_class.iter() {
            entries.push((cls.unbind(), disc.extract::<usize>()?));
        }
        Ok(ByType(entries))
    }

    /// The discriminant of `v`'s class, if it is one of them.
    #[inline]
    fn get(&self, v: &Bound<'_, PyAny>) -> Option<usize> {
        // SAFETY: `v` is a live object; its type is compared by address, not followed
        let tp = unsafe { pyo3::ffi::Py_TYPE(v.as_ptr()) }.cast::<pyo3::ffi::PyObject>();
        self.0
            .iter()
            .find(|(cls, _)| std::ptr::eq(cls.as_ptr(), tp))
            .map(|(_, disc)| *disc)
    }
}

#[derive(Clone, Copy)]
struct S {
    seg: usize,
    data: usize, // word index of the data section
    dw: usize,
    pc: usize,
    depth: u32,
}

const EMPTY: S = S {
    seg: 0,
    data: 0,
    dw: 0,
    pc: 0,
    depth: 0,
};

#[derive(Clone, Copy)]
struct L {
    seg: usize,
    start: usize, // word index of the first element (after the tag for inline composite)
    size: u8,     // element size code
    count: usize,
    dw: usize, // inline composite: words of data / pointers per element
    pc: usize,
    depth: u32,
}

struct Msg<'a> {
    segs: Vec<&'a [u8]>,
    budget: i64,
    units: i64,
    max_units: i64,
}

impl<'a> Msg<'a> {
    fn parse(body: &'a [u8], budget: i64, max_units: i64) -> R<Self> {
        if body.len() < 8 || !body.len().is_multiple_of(8) {
            return Err(refused("length"));
        }
        let count = u32::from_le_bytes(body[0..4].try_into().unwrap()) as usize + 1;
        if count > 512 {
            return Err(refused("segment count"));
        }
        let table_words = (4 + 4 * count).div_ceil(8);
        if body.len() < table_words * 8 {
            return Err(refused("segment table"));
        }
        let mut segs = Vec::with_capacity(count);
        let mut at = table_words * 8;
        for i in 0..count {
            let o = 4 + 4 * i;
            let words = u32::from_le_bytes(body[o..o + 4].try_into().unwrap()) as usize;
            let end = at
                .checked_add(
                    words
                        .checked_mul(8)
                        .ok_or_else(|| refused("segment size"))?,
                )
                .ok_or_else(|| refused("segment size"))?;
            if end > body.len() {
                return Err(refused("segment past the body"));
            }
            segs.push(&body[at..end]);
            at = end;
        }
        Ok(Msg {
            segs,
            budget,
            units: 0,
            max_units,
        })
    }

    #[inline(always)]
    fn word(&self, seg: usize, idx: usize) -> R<u64> {
        let s = self.segs.get(seg).ok_or_else(|| refused("segment id"))?;
        let o = idx.checked_mul(8).ok_or_else(|| refused("offset"))?;
        if o + 8 > s.len() {
            return Err(refused("pointer out of its segment"));
        }
        Ok(u64::from_le_bytes(s[o..o + 8].try_into().unwrap()))
    }

    fn seg_words(&self, seg: usize) -> usize {
        self.segs[seg].len() / 8
    }

    fn charge(&mut self, words: usize) -> R<()> {
        self.budget -= words.max(1) as i64;
        if self.budget < 0 {
            return Err(refused("traversal limit"));
        }
        Ok(())
    }

    /// Charge ``units`` of the frame kind's budget (``bounds.max_units``) before the work they pay for.
    fn spend(&mut self, units: usize) -> R<()> {
        self.units += units as i64;
        if self.units > self.max_units {
            return Err(refused("unit budget"));
        }
        Ok(())
    }

    /// The pointer at (seg, pos): None if null, else (segment, content start word, the word describing it).
    #[inline(always)]
    fn resolve(&self, seg: usize, pos: usize) -> R<Option<(usize, usize, u64)>> {
        let w = self.word(seg, pos)?;
        if w == 0 {
            return Ok(None);
        }
        match w & 3 {
            2 => {
                let double = (w >> 2) & 1 == 1;
                let pad = ((w >> 3) & 0x1fff_ffff) as usize;
                let sid = (w >> 32) as usize;
                if !double {
                    let tag = self.word(sid, pad)?;
                    if tag & 3 >= 2 {
                        return Err(refused("far pointer lands on a far or capability pointer"));
                    }
                    let start = target(pad, tag)?;
                    Ok(Some((sid, start, tag)))
                } else {
                    let far = self.word(sid, pad)?;
                    let tag = self.word(sid, pad + 1)?;
                    if far & 7 != 2 || tag & 3 >= 2 {
                        return Err(refused("malformed double-far landing pad"));
                    }
                    Ok(Some((
                        (far >> 32) as usize,
                        ((far >> 3) & 0x1fff_ffff) as usize,
                        tag,
                    )))
                }
            }
            3 => Err(refused("capability pointer")),
            _ => Ok(Some((seg, target(pos, w)?, w))),
        }
    }

    /// The pointer at `pos` resolved (segment, start, tag word), checked to be of `kind` (0 struct, 1 list) and
    /// within the nesting limit; `None` for a null pointer.
    #[inline(always)]
    fn pointer_at(
        &mut self,
        seg: usize,
        pos: usize,
        depth: u32,
        kind: u64,
        wrong_kind: &'static str,
    ) -> R<Option<(usize, usize, u64)>> {
        let Some((seg, start, tag)) = self.resolve(seg, pos)? else {
            return Ok(None);
        };
        if tag & 3 != kind {
            return Err(refused(wrong_kind));
        }
        if depth >= NESTING_LIMIT {
            return Err(refused("nesting limit"));
        }
        Ok(Some((seg, start, tag)))
    }

    fn struct_at(&mut self, seg: usize, pos: usize, depth: u32) -> R<Option<S>> {
        let Some((seg, start, tag)) =
            self.pointer_at(seg, pos, depth, 0, "expected a struct pointer")?
        else {
            return Ok(None);
        };
        let dw = ((tag >> 32) & 0xffff) as usize;
        let pc = (tag >> 48) as usize;
        if start + dw + pc > self.seg_words(seg) {
            return Err(refused("struct out of its segment"));
        }
        self.charge(dw + pc)?;
        Ok(Some(S {
            seg,
            data: start,
            dw,
            pc,
            depth: depth + 1,
        }))
    }

    fn list_at(&mut self, seg: usize, pos: usize, depth: u32) -> R<Option<L>> {
        let Some((seg, start, tag)) =
            self.pointer_at(seg, pos, depth, 1, "expected a list pointer")?
        else {
            return Ok(None);
        };
        let size = ((tag >> 32) & 7) as u8;
        let n = (tag >> 35) as usize;
        let total = self.seg_words(seg);
        if size == 7 {
            let words = n;
            if start + 1 + words > total {
                return Err(refused("list out of its segment"));
            }
            let head = self.word(seg, start)?;
            if head & 3 != 0 {
                return Err(refused("inline composite tag is not a struct"));
            }
            let count = ((head >> 2) & 0x3fff_ffff) as usize;
            let dw = ((head >> 32) & 0xffff) as usize;
            let pc = (head >> 48) as usize;
            if count.checked_mul(dw + pc).is_none_or(|w| w > words) {
                return Err(refused("inline composite list larger than its words"));
            }
            // elements of no size cost nothing to place: charge them one word each (as the C++ reader does)
            self.charge(if dw + pc == 0 { count + 1 } else { words + 1 })?;
            return Ok(Some(L {
                seg,
                start: start + 1,
                size,
                count,
                dw,
                pc,
                depth: depth + 1,
            }));
        }
        let bits: usize = match size {
            0 => 0,
            1 => 1,
            2 => 8,
            3 => 16,
            4 => 32,
            5 | 6 => 64,
            _ => unreachable!(),
        };
        let words = (n * bits).div_ceil(64);
        if start + words > total {
            return Err(refused("list out of its segment"));
        }
        self.charge(if bits == 0 { n } else { words })?;
        Ok(Some(L {
            seg,
            start,
            size,
            count: n,
            dw: 0,
            pc: 0,
            depth: depth + 1,
        }))
    }

    /// `text_slice`, reading a text whose pointer is a near pointer to a list of bytes (how every writer lays a text
    /// out) straight from the pointer word: the same checks in the same order as `resolve`, `pointer_at` and
    /// `list_at` make (the offset, the nesting limit, the list inside its segment, the traversal budget, a
    /// non-empty list ending in NUL), without the general path's far pointers, element sizes and composite tags.
    /// Any other pointer, or one that fails a check, goes the general way (`text_slice`), which answers it.
    #[inline(always)]
    fn text_bytes(&mut self, seg: usize, pos: usize, depth: u32) -> R<&'a [u8]> {
        let w = self.word(seg, pos)?;
        if w & 3 == 1 && (w >> 32) & 7 == 2 && depth < NESTING_LIMIT {
            let n = (w >> 35) as usize;
            let start = target(pos, w)?;
            let segment: &'a [u8] = self.segs[seg];
            if n > 0 && start + n.div_ceil(8) <= segment.len() / 8 {
                self.charge(n.div_ceil(8))?;
                let bytes = &segment[start * 8..start * 8 + n];
                if bytes[n - 1] != 0 {
                    return Err(refused("text not NUL-terminated"));
                }
                return Ok(&bytes[..n - 1]);
            }
        }
        self.text_slice(seg, pos, depth)
    }

    /// The bytes of the text at (seg, pos) without its NUL, checked as `text_at` checks them but for UTF-8
    /// (the caller checks that before it makes a string of them); empty for a null pointer.
    fn text_slice(&mut self, seg: usize, pos: usize, depth: u32) -> R<&'a [u8]> {
        let Some(l) = self.list_at(seg, pos, depth)? else {
            return Ok(&[]);
        };
        if l.size != 2 || l.count == 0 {
            return Err(refused("text is not a byte list"));
        }
        let segment: &'a [u8] = self.segs[l.seg];
        let bytes = &segment[l.start * 8..l.start * 8 + l.count];
        if bytes[l.count - 1] != 0 {
            return Err(refused("text not NUL-terminated"));
        }
        Ok(&bytes[..l.count - 1])
    }

    fn text_at<'py>(
        &mut self,
        py: Python<'py>,
        seg: usize,
        pos: usize,
        depth: u32,
        intern: bool,
    ) -> R<Bound<'py, PyString>> {
        let Some(l) = self.list_at(seg, pos, depth)? else {
            return Ok(PyString::new(py, ""));
        };
        if l.size != 2 || l.count == 0 {
            return Err(refused("text is not a byte list"));
        }
        let bytes = &self.segs[l.seg][l.start * 8..l.start * 8 + l.count];
        if bytes[l.count - 1] != 0 {
            return Err(refused("text not NUL-terminated"));
        }
        py_text(py, &bytes[..l.count - 1], intern)
    }
}

/// The str of a text's bytes (interned when `intern`), or a refusal when they are not UTF-8.
fn py_text<'py>(py: Python<'py>, raw: &[u8], intern: bool) -> R<Bound<'py, PyString>> {
    // One pass over the text: CPython's strict UTF-8 decoder checks it as `str::from_utf8` would (no
    // surrogates, no overlong forms, nothing above U+10FFFF) while it makes the str, where checking with
    // `from_utf8` first and then making the str read every text twice.
    // SAFETY: `raw` is live for the call; the result is a new reference or NULL with an error set.
    let mut obj = unsafe {
        pyo3::ffi::PyUnicode_DecodeUTF8(
            raw.as_ptr().cast(),
            raw.len() as pyo3::ffi::Py_ssize_t,
            std::ptr::null(),
        )
    };
    if obj.is_null() {
        drop(PyErr::take(py)); // the UnicodeDecodeError: the reference path gives the answer
        return Err(refused("text is not UTF-8"));
    }
    if intern {
        // SAFETY: `obj` is a new reference to an exact str; InternInPlace swaps it for the interned one.
        unsafe { pyo3::ffi::PyUnicode_InternInPlace(&mut obj) };
    }
    // SAFETY: a new (owned) reference to a str.
    Ok(unsafe { Bound::from_owned_ptr(py, obj).downcast_into_unchecked() })
}

#[inline(always)]
fn target(pos: usize, w: u64) -> R<usize> {
    let off = ((w as u32 as i32) >> 2) as i64;
    let t = pos as i64 + 1 + off;
    if t < 0 {
        return Err(refused("pointer before its segment"));
    }
    Ok(t as usize)
}

#[inline(always)]
fn data_u64(m: &Msg, s: &S, idx: usize) -> R<u64> {
    if idx < s.dw {
        m.word(s.seg, s.data + idx)
    } else {
        Ok(0)
    }
}

#[inline(always)]
fn data_bits(m: &Msg, s: &S, offset: usize, width: usize) -> R<u64> {
    let bit = offset * width;
    let w = data_u64(m, s, bit / 64)?;
    let v = w >> (bit % 64);
    Ok(if width == 64 {
        v
    } else {
        v & ((1u64 << width) - 1)
    })
}

#[pyclass(frozen, module = "provisionerd.wire._fastwire")]
struct Codec {
    plans: Vec<Plan>,
    facts: Vec<FactPlan>,
    corr_offset: usize,
    body_disc: usize,
    frame_words: (u16, u16),
    members: Vec<Option<(u32, usize, i64, i64)>>, // body discriminant -> (pointer, plan, max units, max body bytes or -1)
    member_names: Vec<Option<Py<PyString>>>, // body discriminant -> its member's name (`units_now`)
    bounds: Py<PyDict>, // the namespace of the module `provisionerd.wire.bounds` (`units_now`)
    by_class: ByType,   // message class -> body discriminant
    envelope: PyObject,
    envelope_raw: bool, // made as `raw_new` makes values: its `__init__` would only store `corr` and `msg`
    envelope_names: (Py<PyString>, Py<PyString>),
    /// With `envelope_raw`: where `corr` and `msg` sit in an envelope (`slot_offset`), when both are confirmed.
    envelope_slots: Option<(isize, isize)>,
    #[allow(clippy::type_complexity)]
    memo: Held<Vec<Option<(Box<[u8]>, PyObject)>>>, // `Plan.share` values by their bytes (`memo_slot`)
    access: SlotAccess, // the member descriptors' `__get__` and `__set__`
    #[allow(clippy::type_complexity)]
    interned: Held<Vec<Option<(Box<[u8]>, Py<PyString>)>>>, // `Codec::interned`'s slots
    scratch: Held<Vec<u64>>, // the words of the last frames written, kept for the next (`Codec::frames`)
}

impl Codec {
    /// `decode`, with `decode_allowed`'s checks when `check` is given, made on the frame's head.
    fn read<'py>(
        &self,
        py: Python<'py>,
        body: &[u8],
        budget: i64,
        check: Option<(&Bound<'py, PyAny>, i64)>,
    ) -> PyResult<(Bound<'py, PyAny>, i64)> {
        let mut m = Msg::parse(body, budget, i64::MAX)?;
        let root = m.struct_at(0, 0, 0)?.ok_or_else(|| refused("null root"))?;
        let corr = data_bits(&m, &root, self.corr_offset, 64)?;
        let disc = data_bits(&m, &root, self.body_disc, 16)? as usize;
        let Some(Some((ptr, plan, max_units, max_body))) = self.members.get(disc) else {
            return Err(refused("unknown frame kind"));
        };
        if let Some((allowed, max_frame)) = check {
            let limit = if *max_body >= 0 {
                (*max_body).min(max_frame)
            } else {
                max_frame
            };
            if body.len() as i64 > limit {
                return Err(refused("over its kind's bound"));
            }
            if !allowed.contains(self.plans[*plan].cls.bind(py))? {
                return Err(refused("kind not allowed"));
            }
            // the plans hold the kind's budget of when they were made: the frame is charged against the lower of
            // that and the budget as it stands now (`units_now`), which the reference path reads
            m.max_units = (*max_units).min(self.units_now(py, disc)?);
        } else {
            m.max_units = *max_units;
        }
        let inner = self.ptr_struct(&mut m, &root, *ptr)?;
        m.spend(1)?;
        let msg = self.build(py, &mut m, *plan, &inner, None)?;
        let envelope = if self.envelope_raw {
            let (c, n) = &self.envelope_names;
            let cls = self
                .envelope
                .bind(py)
                .downcast::<pyo3::types::PyType>()
                .map_err(|_| refused("not a class"))?;
            let corr = corr.into_pyobject(py)?;
            // SAFETY: as in `raw_new`: a new reference from PyType_GenericAlloc (or NULL with an error set), and
            // live names and values for the calls.
            unsafe {
                let obj = pyo3::ffi::PyType_GenericAlloc(cls.as_type_ptr(), 0);
                if obj.is_null() {
                    return Err(PyErr::fetch(py));
                }
                let obj = Bound::from_owned_ptr(py, obj);
                if let Some((at_corr, at_msg)) = self.envelope_slots {
                    // straight into the two confirmed slots of the new (empty) envelope, as `raw_set` stores a
                    // field: each takes over its value's reference
                    let base = obj.as_ptr().cast::<u8>();
                    *base.offset(at_corr).cast::<*mut pyo3::ffi::PyObject>() = corr.into_ptr();
                    *base.offset(at_msg).cast::<*mut pyo3::ffi::PyObject>() = msg.into_ptr();
                    return Ok((obj, m.units));
                }
                if pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), c.as_ptr(), corr.as_ptr()) != 0
                    || pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), n.as_ptr(), msg.as_ptr())
                        != 0
                {
                    return Err(PyErr::fetch(py));
                }
                obj
            }
        } else {
            self.envelope.bind(py).call1((corr, msg))?
        };
        Ok((envelope, m.units))
    }

    /// `bounds.max_units(member)` of the frame kind `disc` as it stands now: `bounds.MAX_UNITS.get(member,
    /// bounds.DEFAULT_MAX_UNITS)`, read from the module at each call (tests and benches change them). `Refused`
    /// when the module holds something else there than a dict and integers.
    fn units_now(&self, py: Python<'_>, disc: usize) -> R<i64> {
        let name = match self.member_names.get(disc) {
            Some(Some(name)) => name.bind(py),
            _ => return Err(refused("unknown frame kind")),
        };
        // read from the module's namespace, where its attributes are (and where a test's setattr puts them)
        let odd = |_| refused("bounds holds no unit budgets");
        let missing = || refused("bounds holds no unit budgets");
        let bounds = self.bounds.bind(py);
        let table = bounds
            .get_item(pyo3::intern!(py, "MAX_UNITS"))
            .map_err(odd)?
            .ok_or_else(missing)?;
        let table = table
            .downcast_exact::<PyDict>()
            .map_err(|_| refused("bounds.MAX_UNITS is not a dict"))?;
        let units = match table.get_item(name).map_err(odd)? {
            Some(units) => units,
            None => bounds
                .get_item(pyo3::intern!(py, "DEFAULT_MAX_UNITS"))
                .map_err(odd)?
                .ok_or_else(missing)?,
        };
        units
            .downcast_exact::<pyo3::types::PyInt>()
            .map_err(|_| refused("a unit budget is not an int"))?
            .extract::<i64>()
            .map_err(|_| refused("a unit budget out of range"))
    }

    fn element(&self, l: &L, i: usize) -> S {
        S {
            seg: l.seg,
            data: l.start + i * (l.dw + l.pc),
            dw: l.dw,
            pc: l.pc,
            depth: l.depth,
        }
    }

    fn struct_list(&self, m: &mut Msg, s: &S, f: &Field) -> R<Option<L>> {
        if (f.offset as usize) >= s.pc {
            return Ok(None);
        }
        let Some(l) = m.list_at(s.seg, s.data + s.dw + f.offset as usize, s.depth)? else {
            return Ok(None);
        };
        if l.size != 7 {
            return Err(refused("struct list not inline composite"));
        }
        if l.count as u64 > f.cap {
            return Err(refused("list above its cap"));
        }
        Ok(Some(l))
    }

    fn ptr_struct(&self, m: &mut Msg, s: &S, index: u32) -> R<S> {
        if (index as usize) >= s.pc {
            return Ok(S {
                depth: s.depth + 1,
                ..EMPTY
            });
        }
        Ok(m.struct_at(s.seg, s.data + s.dw + index as usize, s.depth)?
            .unwrap_or(S {
                depth: s.depth + 1,
                ..EMPTY
            }))
    }

    fn text<'py>(
        &self,
        py: Python<'py>,
        m: &mut Msg,
        s: &S,
        index: u32,
        intern: bool,
    ) -> R<Bound<'py, PyAny>> {
        if (index as usize) >= s.pc {
            return Ok(PyString::new(py, "").into_any());
        }
        let raw = m.text_bytes(s.seg, s.data + s.dw + index as usize, s.depth)?;
        if intern {
            return Ok(self.interned(py, raw)?.into_any());
        }
        Ok(py_text(py, raw, false)?.into_any())
    }

    /// The interned str of the UTF-8 `raw` (`Refused` when it is not UTF-8). The last one made for a slot of
    /// `interned` is handed out again while the same bytes come: a page names the same few providers, ops, templates
    /// and capability names over and over, and a hit costs a hash of the bytes and one comparison, where making the
    /// str to look it up in CPython's interned table and dropping it cost more. Direct-mapped: a lookup is one
    /// comparison whatever a peer sends, and what it keeps is at most `INTERNED_SLOTS` short texts.
    fn interned<'py>(&self, py: Python<'py>, raw: &[u8]) -> R<Bound<'py, PyString>> {
        let slot = (raw.len() <= INTERNED_KEY_MAX).then(|| fnv1a(raw) % INTERNED_SLOTS);
        if let Some(i) = slot {
            if let Some((key, text)) = &self.interned.get(py).borrow()[i] {
                if **key == *raw {
                    return Ok(text.bind(py).clone());
                }
            }
        }
        let text = py_text(py, raw, true)?;
        if let Some(i) = slot {
            let old =
                self.interned.get(py).borrow_mut()[i].replace((raw.into(), text.clone().unbind()));
            drop(old); // once the cell is free again (`Held`)
        }
        Ok(text)
    }

    fn value<'py>(&self, py: Python<'py>, m: &mut Msg, f: &Field, s: &S) -> R<Bound<'py, PyAny>> {
        let off = f.offset as usize;
        Ok(match f.kind {
            K_BOOL => PyBool::new(py, data_bits(m, s, off, 1)? != 0)
                .to_owned()
                .into_any(),
            K_U32 => data_bits(m, s, off, 32)?.into_pyobject(py)?.into_any(),
            K_U64 => data_bits(m, s, off, 64)?.into_pyobject(py)?.into_any(),
            K_I32 => (data_bits(m, s, off, 32)? as u32 as i32)
                .into_pyobject(py)?
                .into_any(),
            K_F64 => PyFloat::new(py, f64::from_bits(data_bits(m, s, off, 64)?)).into_any(),
            K_TEXT | K_TEXT_INTERN => self.text(py, m, s, f.offset, f.kind == K_TEXT_INTERN)?,
            K_ENUM => {
                let raw = data_bits(m, s, off, 16)? as usize;
                match f.table.get(raw) {
                    Some(Some(v)) => v.bind(py).clone(),
                    _ => return Err(refused("unknown enumerant")),
                }
            }
            K_STRUCT => {
                let inner = self.ptr_struct(m, s, f.offset)?;
                m.spend(1)?;
                self.build(py, m, f.plan, &inner, None)?
            }
            K_FACT => {
                let fact = self.ptr_struct(m, s, f.offset)?;
                self.fact(py, m, f.plan, &fact)?
            }
            K_OPT_TEXT | K_OPT_F64 => {
                let opt = self.ptr_struct(m, s, f.offset)?;
                let disc = data_bits(m, &opt, f.opt_disc as usize, 16)?;
                if disc == f.opt_none as u64 {
                    py.None().into_bound(py)
                } else if disc != f.opt_some as u64 {
                    return Err(refused("an optional's union holds no member"));
                } else if f.kind == K_OPT_TEXT {
                    self.text(py, m, &opt, 0, false)?
                } else {
                    PyFloat::new(py, f64::from_bits(data_bits(m, &opt, f.cap as usize, 64)?))
                        .into_any()
                }
            }
            K_LIST_TEXT => {
                if off >= s.pc {
                    return Ok(PyTuple::empty(py).into_any());
                }
                let Some(l) = m.list_at(s.seg, s.data + s.dw + off, s.depth)? else {
                    return Ok(PyTuple::empty(py).into_any());
                };
                if l.size != 6 {
                    return Err(refused("text list not a pointer list"));
                }
                if l.count as u64 > f.cap {
                    return Err(refused("list above its cap"));
                }
                let mut items = Vec::with_capacity(l.count);
                for i in 0..l.count {
                    items.push(m.text_at(py, l.seg, l.start + i, l.depth, false)?);
                }
                PyTuple::new(py, items)?.into_any()
            }
            K_LIST_STRUCT => {
                let Some(l) = self.struct_list(m, s, f)? else {
                    return Ok(PyTuple::empty(py).into_any());
                };
                m.spend(l.count)?;
                let mut items = Vec::with_capacity(l.count);
                for i in 0..l.count {
                    let e = self.element(&l, i);
                    items.push(self.build(py, m, f.plan, &e, None)?);
                }
                PyTuple::new(py, items)?.into_any()
            }
            K_MAP => {
                let dict = PyDict::new(py);
                let Some(l) = self.struct_list(m, s, f)? else {
                    return Ok(dict.into_any());
                };
                m.spend(l.count)?;
                // Keys and values interned (`codec._read_map`): a fleet's maps (a host's capabilities, an item's
                // attributes) repeat a few names and values across thousands of values the view holds.
                for i in 0..l.count {
                    let e = self.element(&l, i);
                    let key = self.text(py, m, &e, 0, true)?;
                    if dict.contains(&key)? {
                        return Err(refused("duplicate key"));
                    }
                    let value = self.text(py, m, &e, 1, true)?;
                    dict.set_item(key, value)?;
                }
                dict.into_any()
            }
            _ => return Err(refused("unknown field kind")),
        })
    }

    fn build<'py>(
        &self,
        py: Python<'py>,
        m: &mut Msg,
        plan: usize,
        s: &S,
        outer: Option<&S>,
    ) -> R<Bound<'py, PyAny>> {
        let p = &self.plans[plan];
        if p.share && outer.is_none() {
            return self.shared(py, m, plan, s);
        }
        if p.raw_new {
            // made first, each field stored as it is read: no list of the values in between
            let obj = raw_alloc(py, p)?;
            for (i, f) in p.fields.iter().enumerate() {
                let from = if f.outer {
                    outer.ok_or_else(|| refused("header field outside a fact"))?
                } else {
                    s
                };
                // a text (most fields) read here, without `value`'s dispatch over every kind
                let value = if f.kind == K_TEXT || f.kind == K_TEXT_INTERN {
                    self.text(py, m, from, f.offset, f.kind == K_TEXT_INTERN)?
                } else {
                    self.value(py, m, f, from)?
                };
                raw_set(py, self.access, p, i, &obj, value)?;
            }
            return Ok(obj);
        }
        let mut args = Vec::with_capacity(p.fields.len());
        for f in &p.fields {
            let from = if f.outer {
                outer.ok_or_else(|| refused("header field outside a fact"))?
            } else {
                s
            };
            args.push(self.value(py, m, f, from)?);
        }
        p.cls.bind(py).call1(PyTuple::new(py, args)?)
    }

    /// A `share` plan's value: the one already decoded from the same data words and texts, or a new one (kept).
    /// Equal bytes decode to equal values, so sharing changes nothing but the count of objects (a page of
    /// facts carries a few epochs and price quotes many times over).
    fn shared<'py>(
        &self,
        py: Python<'py>,
        m: &mut Msg,
        plan: usize,
        s: &S,
    ) -> R<Bound<'py, PyAny>> {
        let p = &self.plans[plan];
        // the key is made on the stack: only a value decoded for the first time takes a copy of it into the memo
        let mut key = MemoKey::new();
        key.push(&(plan as u32).to_le_bytes());
        key.push(&(s.dw as u32).to_le_bytes());
        for i in 0..s.dw {
            key.push(&m.word(s.seg, s.data + i)?.to_le_bytes());
        }
        let mut texts: [&[u8]; MEMO_TEXTS] = [&[]; MEMO_TEXTS]; // a shared plan has at most MEMO_TEXTS (`new`)
        let mut n = 0;
        for f in &p.fields {
            if f.kind == K_TEXT || f.kind == K_TEXT_INTERN {
                let bytes = if (f.offset as usize) < s.pc {
                    m.text_bytes(s.seg, s.data + s.dw + f.offset as usize, s.depth)?
                } else {
                    &[]
                };
                key.push(&(bytes.len() as u32).to_le_bytes());
                key.push(bytes);
                texts[n] = bytes;
                n += 1;
            }
        }
        let key = key.get();
        let slot = key.map(memo_slot);
        if let (Some(key), Some(i)) = (key, slot) {
            if let Some((held, v)) = &self.memo.get(py).borrow()[i] {
                if **held == *key {
                    return Ok(v.bind(py).clone());
                }
            }
        }
        let mut args = Vec::with_capacity(p.fields.len());
        let mut next = texts[..n].iter();
        for f in &p.fields {
            if f.kind == K_TEXT || f.kind == K_TEXT_INTERN {
                let bytes = next.next().expect("one slice per text field");
                args.push(py_text(py, bytes, f.kind == K_TEXT_INTERN)?.into_any());
            } else {
                args.push(self.value(py, m, f, s)?);
            }
        }
        let value = p.cls.bind(py).call1(PyTuple::new(py, args)?)?;
        if let (Some(key), Some(i)) = (key, slot) {
            let old =
                self.memo.get(py).borrow_mut()[i].replace((key.into(), value.clone().unbind()));
            drop(old); // once the cell is free again (`Held`)
        }
        Ok(value)
    }

    fn fact<'py>(
        &self,
        py: Python<'py>,
        m: &mut Msg,
        fact_plan: usize,
        fact: &S,
    ) -> R<Bound<'py, PyAny>> {
        let fp = &self.facts[fact_plan];
        let disc = data_bits(m, fact, fp.disc_offset as usize, 16)? as usize;
        let Some(Some((ptr, plan))) = fp.members.get(disc) else {
            return Err(refused("unknown fact kind"));
        };
        let member = self.ptr_struct(m, fact, *ptr)?;
        m.spend(1)?;
        self.build(py, m, *plan, &member, Some(fact))
    }
}

/// A message being built: one segment of words, allocated in the order the reference writer allocates (each
/// struct, list and text when its field is written, depth first in field order), so that a message that fits
/// pycapnp's first segment comes out byte for byte as the reference encodes it.
struct Out {
    words: Vec<u64>,
}

impl Out {
    fn alloc(&mut self, n: usize) -> usize {
        let at = self.words.len();
        self.words.resize(at + n, 0);
        at
    }

    fn pointer(&mut self, at: usize, target: usize, low: u64, high: u64) {
        let off = (target as i64 - at as i64 - 1) as i32 as u32 as u64;
        self.words[at] = ((off << 2) & 0xffff_fffc) | low | (high << 32);
    }

    fn new_struct(&mut self, at: usize, dw: u16, pc: u16) -> S {
        let start = self.alloc(dw as usize + pc as usize);
        // a struct of no size points at its own pointer (offset -1), as Cap'n Proto writers do: a zero word
        // there would read as a null pointer
        let target = if dw == 0 && pc == 0 { at } else { start };
        self.pointer(at, target, 0, dw as u64 | ((pc as u64) << 16));
        S {
            seg: 0,
            data: start,
            dw: dw as usize,
            pc: pc as usize,
            depth: 0,
        }
    }

    fn set_bits(&mut self, s: &S, offset: usize, width: usize, v: u64) {
        let bit = offset * width;
        let w = &mut self.words[s.data + bit / 64];
        let mask = if width == 64 {
            u64::MAX
        } else {
            ((1u64 << width) - 1) << (bit % 64)
        };
        *w = (*w & !mask) | ((v << (bit % 64)) & mask);
    }

    fn text(&mut self, at: usize, v: &str) {
        let n = v.len() + 1;
        let words = n.div_ceil(8);
        let bytes = v.as_bytes();
        if cfg!(target_endian = "little") {
            // the words are laid out as the body's bytes already: the text in one copy, its NUL and padding the
            // zeros of its last word, written first (no zero fill of all its words, as `alloc` does)
            let start = self.words.len();
            self.words.reserve(words);
            // SAFETY: `words` words from `start` are inside the capacity just reserved; the last is written whole,
            // then the text's bytes from the first (`bytes.len() < 8 * words`, and they reach at least into the
            // last word: `8 * (words - 1) <= bytes.len()`), so every one of the `words` words is written before the
            // length takes them in. Any bytes are a valid u8 view of u64s.
            unsafe {
                let out = self.words.as_mut_ptr().add(start);
                out.add(words - 1).write(0);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
                self.words.set_len(start + words);
            }
            self.pointer(at, start, 1, 2 | ((n as u64) << 3));
            return;
        }
        let start = self.alloc(words);
        self.pointer(at, start, 1, 2 | ((n as u64) << 3));
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.words[start + i] = u64::from_le_bytes(word);
        }
    }

    fn composite(&mut self, at: usize, count: usize, dw: u16, pc: u16) -> usize {
        let size = dw as usize + pc as usize;
        let start = self.alloc(1 + count * size);
        self.pointer(at, start, 1, 7 | (((count * size) as u64) << 3));
        self.words[start] = ((count as u64) << 2) | ((dw as u64) << 32) | ((pc as u64) << 48);
        start + 1
    }
}

/// A new `p.cls` value with no field set, made as `object.__new__(cls)` makes it: for a class whose `__init__`
/// would only store its fields (no validator, converter or post-init: `codec.py` decides); `raw_set` stores them.
fn raw_alloc<'py>(py: Python<'py>, p: &Plan) -> R<Bound<'py, PyAny>> {
    let cls = p
        .cls
        .bind(py)
        .downcast::<pyo3::types::PyType>()
        .map_err(|_| refused("not a class"))?;
    // SAFETY: `cls` is a live type object; PyType_GenericAlloc returns a new reference (or NULL with an error
    // set), which `from_owned_ptr` takes over.
    unsafe {
        let obj = pyo3::ffi::PyType_GenericAlloc(cls.as_type_ptr(), 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, obj))
    }
}

/// Field `i` of `obj` (a `raw_alloc` value of `p.cls`) set to `value`, as `object.__setattr__` sets it: straight
/// into its slot where `p.offsets` has it, else through the slot's descriptor, else by name.
fn raw_set(
    py: Python<'_>,
    access: SlotAccess,
    p: &Plan,
    i: usize,
    obj: &Bound<'_, PyAny>,
    value: Bound<'_, PyAny>,
) -> R<()> {
    let f = &p.fields[i];
    // SAFETY: `obj` is a live value of `p.cls` (`raw_alloc`), so a confirmed offset is a slot inside it
    // (`slot_offset`); the slot takes over `value`'s reference and gives up the one it held, if any (what the
    // descriptor's `__set__` does, less its checks). The names, descriptors and values are live for the calls.
    unsafe {
        if p.slots && p.offsets[i] != 0 {
            let at = obj
                .as_ptr()
                .cast::<u8>()
                .offset(p.offsets[i])
                .cast::<*mut pyo3::ffi::PyObject>();
            let old = std::ptr::replace(at, value.into_ptr());
            pyo3::ffi::Py_XDECREF(old);
            return Ok(());
        }
        // what `object.__setattr__` does, less finding the descriptor by the field's name
        let failed = match (&f.slot, p.slots) {
            (Some(slot), true) => access.set(slot, obj.as_ptr(), value.as_ptr()) != 0,
            _ => {
                pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), f.name.as_ptr(), value.as_ptr())
                    != 0
            }
        };
        if failed {
            return Err(PyErr::fetch(py));
        }
    }
    Ok(())
}

/// CPython's `PyMemberDescrObject` (a slot's descriptor), which the limited API does not show: its common
/// descriptor head, then its `PyMemberDef`. `slot_offset` reads it only once it has confirmed the layout.
#[repr(C)]
struct MemberDescr {
    ob_base: pyo3::ffi::PyObject,
    d_type: *mut pyo3::ffi::PyTypeObject,
    d_name: *mut pyo3::ffi::PyObject,
    d_qualname: *mut pyo3::ffi::PyObject,
    d_member: *const pyo3::ffi::PyMemberDef,
}

/// Where a value of `cls` holds the slot of `descr` (a member descriptor: the caller checks its type), the
/// field `name`, in bytes from the value's start; None when that is not certain, and the field is then read and
/// written through the descriptor. The descriptor is read as `MemberDescr` only once its head is confirmed by
/// identity alone (no pointer followed): its name is `name` (both interned: CPython interns a descriptor's name,
/// `codec.py` the field's) and its class is `cls` or a base of it. Its member must then be an object slot
/// (`Py_T_OBJECT_EX`, what `__slots__` makes), writable, pointer-aligned and inside `cls`'s `basicsize`.
fn slot_offset(
    cls: &Bound<'_, pyo3::types::PyType>,
    descr: &Bound<'_, PyAny>,
    name: &Py<PyString>,
    basicsize: isize,
) -> Option<isize> {
    let word = std::mem::size_of::<*mut pyo3::ffi::PyObject>() as isize;
    // SAFETY: `descr` is a live member descriptor, so at least as large as `MemberDescr` (CPython's layout since
    // 3.3); its head is compared by identity before `d_member` is followed, and PyType_IsSubtype compares
    // `d_type` with the entries of `cls`'s MRO without reading through it.
    unsafe {
        let d = descr.as_ptr().cast::<MemberDescr>();
        if (*d).d_name != name.as_ptr()
            || pyo3::ffi::PyType_IsSubtype(cls.as_type_ptr(), (*d).d_type) == 0
            || (*d).d_member.is_null()
        {
            return None;
        }
        let member = &*(*d).d_member;
        let fits = member.offset >= std::mem::size_of::<pyo3::ffi::PyObject>() as isize
            && member.offset % word == 0
            && member.offset + word <= basicsize;
        (member.type_code == pyo3::ffi::Py_T_OBJECT_EX
            && member.flags & pyo3::ffi::Py_READONLY == 0
            && fits)
            .then_some(member.offset)
    }
}

/// The `__get__` and `__set__` of the member descriptor type (slots), called straight: `getattr(obj, name)` on a
/// class that finds attributes the generic way looks `name` up in the class and calls the same descriptor's.
#[derive(Clone, Copy)]
struct SlotAccess {
    get: pyo3::ffi::descrgetfunc,
    set: pyo3::ffi::descrsetfunc,
}

impl SlotAccess {
    /// Those of `descriptor_type` (`types.MemberDescriptorType`).
    fn of(descriptor_type: &Bound<'_, pyo3::types::PyType>) -> PyResult<Self> {
        // SAFETY: a live type object; PyType_GetSlot returns the slot's function or NULL.
        let (get, set) = unsafe {
            let tp = descriptor_type.as_type_ptr();
            (
                pyo3::ffi::PyType_GetSlot(tp, pyo3::ffi::Py_tp_descr_get),
                pyo3::ffi::PyType_GetSlot(tp, pyo3::ffi::Py_tp_descr_set),
            )
        };
        if get.is_null() || set.is_null() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "not a data descriptor type",
            ));
        }
        // SAFETY: the slots hold functions of these signatures (CPython's descrgetfunc and descrsetfunc).
        unsafe {
            Ok(SlotAccess {
                get: std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrgetfunc>(get),
                set: std::mem::transmute::<*mut std::ffi::c_void, pyo3::ffi::descrsetfunc>(set),
            })
        }
    }

    /// `slot.__get__(obj, type(obj))`: a new reference, or NULL with an error set.
    ///
    /// SAFETY: `slot` is an instance of the descriptor type these came from, `obj` a live object.
    unsafe fn get(
        &self,
        slot: &PyObject,
        obj: *mut pyo3::ffi::PyObject,
    ) -> *mut pyo3::ffi::PyObject {
        (self.get)(slot.as_ptr(), obj, pyo3::ffi::Py_TYPE(obj).cast())
    }

    /// `slot.__set__(obj, value)`: 0, or -1 with an error set.
    ///
    /// SAFETY: as `get`, and `value` a live object.
    unsafe fn set(
        &self,
        slot: &PyObject,
        obj: *mut pyo3::ffi::PyObject,
        value: *mut pyo3::ffi::PyObject,
    ) -> i32 {
        (self.set)(slot.as_ptr(), obj, value)
    }
}

/// The object pointer stored in the slot at `offset` bytes into `v` (NULL: the slot is unset), not a reference.
///
/// # Safety
/// `offset` must be a confirmed object slot inside `v`'s instance (`slot_offset`, checked for `v`'s exact class).
#[inline]
unsafe fn slot_value(v: &Bound<'_, PyAny>, offset: isize) -> *mut pyo3::ffi::PyObject {
    *v.as_ptr()
        .cast::<u8>()
        .offset(offset)
        .cast::<*mut pyo3::ffi::PyObject>()
}

/// The UTF-8 of a str, borrowed from it (CPython keeps it with the str: no copy before it goes into the words).
fn text_of<'a>(v: &'a Bound<'_, PyAny>) -> R<&'a str> {
    let s = v.downcast::<PyString>().map_err(|_| refused("not a str"))?;
    s.to_str().map_err(|_| refused("not encodable as UTF-8"))
}

/// `text_of` of an object known to be an exact str (the caller checked its type), read by one call: the bytes are
/// borrowed from the str, which the caller holds (or borrows from a value that holds it) while it uses them.
///
/// # Safety
/// `obj` must be a live `str` that outlives the returned bytes.
#[inline(always)]
unsafe fn str_utf8<'a>(py: Python<'_>, obj: *mut pyo3::ffi::PyObject) -> R<&'a str> {
    let mut size: pyo3::ffi::Py_ssize_t = 0;
    let data = pyo3::ffi::PyUnicode_AsUTF8AndSize(obj, &mut size);
    if data.is_null() {
        drop(PyErr::take(py)); // a lone surrogate: the reference path gives the answer
        return Err(refused("not encodable as UTF-8"));
    }
    // the UTF-8 CPython made (or keeps) for a str: valid UTF-8, `size` bytes, kept with the str
    Ok(std::str::from_utf8_unchecked(std::slice::from_raw_parts(
        data.cast::<u8>(),
        size as usize,
    )))
}

impl Codec {
    fn put(&self, py: Python<'_>, o: &mut Out, f: &Field, s: &S, v: &Bound<'_, PyAny>) -> R<()> {
        let at = s.data + s.dw + f.offset as usize;
        let off = f.offset as usize;
        match f.kind {
            K_BOOL => {
                let b = v
                    .downcast::<PyBool>()
                    .map_err(|_| refused("not a bool"))?
                    .is_true();
                o.set_bits(s, off, 1, b as u64)
            }
            K_U32 => o.set_bits(
                s,
                off,
                32,
                v.extract::<u32>().map_err(|_| refused("not a u32"))? as u64,
            ),
            K_U64 => o.set_bits(
                s,
                off,
                64,
                v.extract::<u64>().map_err(|_| refused("not a u64"))?,
            ),
            K_I32 => o.set_bits(
                s,
                off,
                32,
                v.extract::<i32>().map_err(|_| refused("not an i32"))? as u32 as u64,
            ),
            K_F64 => o.set_bits(
                s,
                off,
                64,
                v.extract::<f64>()
                    .map_err(|_| refused("not a float"))?
                    .to_bits(),
            ),
            K_TEXT | K_TEXT_INTERN => o.text(at, text_of(v)?),
            K_ENUM => {
                let raw = f
                    .raw
                    .bind(py)
                    .get_item(v)
                    .ok()
                    .flatten()
                    .ok_or_else(|| refused("no such enumerant"))?;
                o.set_bits(s, off, 16, raw.extract::<u16>()? as u64)
            }
            K_STRUCT => {
                let p = &self.plans[f.plan];
                let inner = o.new_struct(at, p.dw, p.pc);
                self.put_struct(py, o, f.plan, &inner, v, None)?
            }
            K_FACT => self.put_fact(py, o, f.plan, at, v)?,
            K_OPT_TEXT | K_OPT_F64 => {
                let opt = o.new_struct(at, f.words.0, f.words.1);
                if v.is_none() {
                    o.set_bits(&opt, f.opt_disc as usize, 16, f.opt_none as u64);
                } else {
                    o.set_bits(&opt, f.opt_disc as usize, 16, f.opt_some as u64);
                    if f.kind == K_OPT_TEXT {
                        o.text(opt.data + opt.dw, text_of(v)?)
                    } else {
                        o.set_bits(
                            &opt,
                            f.cap as usize,
                            64,
                            v.extract::<f64>().map_err(|_| refused("float"))?.to_bits(),
                        )
                    }
                }
            }
            K_LIST_TEXT => {
                let items = v
                    .downcast::<PyTuple>()
                    .map_err(|_| refused("not a tuple"))?;
                let n = items.len();
                let start = o.alloc(n);
                o.pointer(at, start, 1, 6 | ((n as u64) << 3));
                for (i, item) in items.iter().enumerate() {
                    o.text(start + i, text_of(&item)?);
                }
            }
            K_LIST_STRUCT => {
                let items = v
                    .downcast::<PyTuple>()
                    .map_err(|_| refused("not a tuple"))?;
                let p = &self.plans[f.plan];
                let size = p.dw as usize + p.pc as usize;
                let first = o.composite(at, items.len(), p.dw, p.pc);
                for (i, item) in items.iter().enumerate() {
                    let e = S {
                        seg: 0,
                        data: first + i * size,
                        dw: p.dw as usize,
                        pc: p.pc as usize,
                        depth: 0,
                    };
                    self.put_struct(py, o, f.plan, &e, &item, None)?;
                }
            }
            K_MAP => {
                let map = v.downcast::<PyDict>().map_err(|_| refused("not a dict"))?;
                let mut entries = Vec::with_capacity(map.len());
                for (k, val) in map.iter() {
                    entries.push((text_of(&k)?.to_owned(), text_of(&val)?.to_owned()));
                }
                entries.sort(); // key order, as the reference writes it (keys are unique)
                let (dw, pc) = f.words;
                let size = dw as usize + pc as usize;
                let first = o.composite(at, entries.len(), dw, pc);
                for (i, (k, val)) in entries.iter().enumerate() {
                    let e = first + i * size + dw as usize;
                    o.text(e, k);
                    o.text(e + 1, val);
                }
            }
            _ => return Err(refused("unknown field kind")),
        }
        Ok(())
    }

    /// The fields of `v` into `s` (its header fields into `outer`, for a fact), in the reference writer's order.
    fn put_struct(
        &self,
        py: Python<'_>,
        o: &mut Out,
        plan: usize,
        s: &S,
        v: &Bound<'_, PyAny>,
        outer: Option<&S>,
    ) -> R<()> {
        let p = &self.plans[plan];
        let direct = self.direct(py, p, v);
        for (i, f) in p.fields.iter().enumerate() {
            let to = if f.outer {
                outer.ok_or_else(|| refused("header field outside a fact"))?
            } else {
                s
            };
            self.put_field(o, p, i, to, v, direct)?;
        }
        Ok(())
    }

    /// Field `i` of plan `p` read from `v` (`attr`) and written into `to` (`put`). A str, int, float or bool of
    /// exactly those types found in its slot is written borrowed from `v`, with no reference of its own taken and
    /// given back: writing one runs no Python code, so no other code can replace the slot's value meanwhile.
    #[inline]
    fn put_field(
        &self,
        o: &mut Out,
        p: &Plan,
        i: usize,
        to: &S,
        v: &Bound<'_, PyAny>,
        direct: bool,
    ) -> R<()> {
        let (py, f) = (v.py(), &p.fields[i]);
        if direct && p.offsets[i] != 0 && f.kind <= K_TEXT_INTERN {
            // SAFETY: as in `attr`: a confirmed slot inside `v`, a value of `p.cls` itself. The value found there
            // is used only while `v` holds it, in `put` of a scalar or text kind (or `str_utf8` and `Out::text` of
            // an exact str), which for these exact types calls no Python code (no `__index__`, `__float__` or
            // `__str__` of a subclass).
            unsafe {
                let got = slot_value(v, p.offsets[i]);
                if !got.is_null() {
                    let tp = pyo3::ffi::Py_TYPE(got);
                    if std::ptr::eq(tp, &raw mut pyo3::ffi::PyUnicode_Type)
                        && (f.kind == K_TEXT || f.kind == K_TEXT_INTERN)
                    {
                        // a text (most fields): its UTF-8 straight into the words, without `put`'s dispatch
                        o.text(to.data + to.dw + f.offset as usize, str_utf8(py, got)?);
                        return Ok(());
                    }
                    if std::ptr::eq(tp, &raw mut pyo3::ffi::PyUnicode_Type)
                        || std::ptr::eq(tp, &raw mut pyo3::ffi::PyLong_Type)
                        || std::ptr::eq(tp, &raw mut pyo3::ffi::PyFloat_Type)
                        || std::ptr::eq(tp, &raw mut pyo3::ffi::PyBool_Type)
                    {
                        return self.put(py, o, f, to, &Borrowed::from_ptr(py, got));
                    }
                }
            }
        }
        self.put(py, o, f, to, &self.attr(py, p, i, v, direct)?)
    }

    /// Whether `v`'s fields may be read through their slots: `v` is of the plan's own class (not a subclass,
    /// which could define them otherwise) and the plan has them.
    #[inline]
    fn direct(&self, _py: Python<'_>, p: &Plan, v: &Bound<'_, PyAny>) -> bool {
        // SAFETY: `v` is a live object; its type is compared by address, not followed
        p.slots
            && std::ptr::eq(
                unsafe { pyo3::ffi::Py_TYPE(v.as_ptr()) }.cast(),
                p.cls.as_ptr(),
            )
    }

    /// `getattr(v, name)` of field `i` of plan `p`, through the field's slot when `direct`: read straight from
    /// the value where `p.offsets` has the slot and it holds a value, else through the slot's descriptor (which
    /// raises the `AttributeError` of an unset slot).
    #[inline]
    fn attr<'py>(
        &self,
        py: Python<'py>,
        p: &Plan,
        i: usize,
        v: &Bound<'py, PyAny>,
        direct: bool,
    ) -> R<Bound<'py, PyAny>> {
        let f = &p.fields[i];
        if direct && p.offsets[i] != 0 {
            // SAFETY: `v` is a live value of `p.cls` itself (`direct`), so the confirmed offset is a slot inside
            // it (`slot_offset`); a value found there is borrowed for a new reference.
            unsafe {
                let got = slot_value(v, p.offsets[i]);
                if !got.is_null() {
                    return Ok(Bound::from_borrowed_ptr(py, got));
                }
            }
        }
        match (&f.slot, direct) {
            // SAFETY: `slot` is a member descriptor (`native.py`), `v` a live object of its class; the result is
            // a new reference, or NULL with an error set.
            (Some(slot), true) => unsafe {
                let got = self.access.get(slot, v.as_ptr());
                if got.is_null() {
                    Err(PyErr::fetch(py))
                } else {
                    Ok(Bound::from_owned_ptr(py, got))
                }
            },
            _ => v.getattr(f.name.bind(py)),
        }
    }

    fn put_fact(
        &self,
        py: Python<'_>,
        o: &mut Out,
        fact_plan: usize,
        at: usize,
        v: &Bound<'_, PyAny>,
    ) -> R<()> {
        let fp = &self.facts[fact_plan];
        let disc = fp.by_class.get(v).ok_or_else(|| refused("not a fact"))?;
        let Some(Some((ptr, plan))) = fp.members.get(disc) else {
            return Err(refused("not a fact"));
        };
        let fact = o.new_struct(at, fp.dw, fp.pc);
        o.set_bits(&fact, fp.disc_offset as usize, 16, disc as u64);
        let p = &self.plans[*plan];
        let direct = self.direct(py, p, v);
        // the header first (the reference writes it before it initialises the member), then the member
        for (i, _) in p.fields.iter().enumerate().filter(|(_, f)| f.outer) {
            self.put_field(o, p, i, &fact, v, direct)?;
        }
        let member = o.new_struct(fact.data + fact.dw + *ptr as usize, p.dw, p.pc);
        for (i, _) in p.fields.iter().enumerate().filter(|(_, f)| !f.outer) {
            self.put_field(o, p, i, &member, v, direct)?;
        }
        Ok(())
    }
}

/// Where an envelope (`cls`) holds `corr` and `msg` (`names`), when `slot_offset` confirms both for the descriptors
/// the class finds by those names; None otherwise (then they are set by name).
fn envelope_slots(
    py: Python<'_>,
    cls: &PyObject,
    names: &(Py<PyString>, Py<PyString>),
    slot_type: &Bound<'_, pyo3::types::PyType>,
) -> PyResult<Option<(isize, isize)>> {
    let Ok(cls) = cls.bind(py).downcast::<pyo3::types::PyType>() else {
        return Ok(None);
    };
    let basicsize: isize = cls.getattr("__basicsize__")?.extract()?;
    let find = |name: &Py<PyString>| {
        let descr = cls.getattr(name.bind(py)).ok()?;
        descr
            .get_type()
            .is(slot_type)
            .then(|| slot_offset(cls, &descr, name, basicsize))
            .flatten()
    };
    Ok(find(&names.0).zip(find(&names.1)))
}

/// `Plan.offsets` for the fields of `cls`: each slot's offset where `slot_offset` confirms it (only for a plan read
/// through its slots, whose descriptors are of `slot_type`), else 0.
fn slot_offsets(
    py: Python<'_>,
    cls: &PyObject,
    fields: &[Field],
    slots: bool,
    slot_type: &Bound<'_, pyo3::types::PyType>,
) -> PyResult<Vec<isize>> {
    let mut offsets = vec![0; fields.len()];
    let Ok(cls) = cls.bind(py).downcast::<pyo3::types::PyType>() else {
        return Ok(offsets);
    };
    if !slots {
        return Ok(offsets);
    }
    let basicsize: isize = cls.getattr("__basicsize__")?.extract()?;
    for (offset, f) in offsets.iter_mut().zip(fields) {
        if let Some(slot) = &f.slot {
            let slot = slot.bind(py);
            if slot.get_type().is(slot_type) {
                *offset = slot_offset(cls, slot, &f.name, basicsize).unwrap_or(0);
            }
        }
    }
    Ok(offsets)
}

#[pymethods]
impl Codec {
    /// Codec(plans, facts, frame, (envelope class, made raw), the member descriptor type); see provisionerd/wire/codec.py (``_NativePlans``) for the shapes.
    #[new]
    #[allow(clippy::type_complexity)]
    fn new(
        py: Python<'_>,
        plans: Vec<(PyObject, u16, u16, Vec<Field>, bool, bool, bool)>,
        facts: Vec<(
            u32,
            u16,
            u16,
            std::collections::HashMap<usize, (u32, usize)>,
            Py<PyDict>,
        )>,
        frame: (
            usize,
            usize,
            (u16, u16),
            std::collections::HashMap<usize, (u32, usize, i64, i64)>,
            Py<PyDict>,
            std::collections::HashMap<usize, Py<PyString>>,
        ),
        envelope: (PyObject, bool),
        slot_type: &Bound<'_, pyo3::types::PyType>,
        bounds: PyObject,
    ) -> PyResult<Self> {
        let access = SlotAccess::of(slot_type)?;
        let envelope_names = (
            PyString::intern(py, "corr").unbind(),
            PyString::intern(py, "msg").unbind(),
        );
        let n = plans.len();
        let nf = facts.len();
        let plans: Vec<Plan> = plans
            .into_iter()
            .map(|(cls, dw, pc, fields, share, raw_new, slots)| {
                let offsets = slot_offsets(py, &cls, &fields, slots, slot_type)?;
                let texts = fields
                    .iter()
                    .filter(|f| f.kind == K_TEXT || f.kind == K_TEXT_INTERN)
                    .count();
                Ok(Plan {
                    cls,
                    dw,
                    pc,
                    share: share && texts <= MEMO_TEXTS, // `shared` keeps at most MEMO_TEXTS on the stack
                    fields,
                    raw_new,
                    slots,
                    offsets,
                })
            })
            .collect::<PyResult<_>>()?;
        let bad = |why: &str| pyo3::exceptions::PyValueError::new_err(why.to_string());
        for p in &plans {
            for f in &p.fields {
                if p.slots
                    && !f
                        .slot
                        .as_ref()
                        .is_some_and(|d| d.bind(py).is_instance(slot_type).unwrap_or(false))
                {
                    return Err(bad("a plan read through slots has a field without one"));
                }
                let wrong = match f.kind {
                    K_STRUCT | K_LIST_STRUCT => f.plan >= n,
                    K_FACT => f.plan >= nf,
                    k => k > K_FACT,
                };
                if wrong {
                    return Err(bad("a plan refers to no plan"));
                }
            }
        }
        fn dense<T>(m: std::collections::HashMap<usize, T>) -> Vec<Option<T>> {
            let len = m.keys().max().map_or(0, |k| k + 1);
            let mut v: Vec<Option<T>> = (0..len).map(|_| None).collect();
            for (k, x) in m {
                v[k] = Some(x);
            }
            v
        }
        let facts: Vec<FactPlan> = facts
            .into_iter()
            .map(|(disc_offset, dw, pc, members, by_class)| {
                Ok(FactPlan {
                    disc_offset,
                    dw,
                    pc,
                    members: dense(members),
                    by_class: ByType::of(by_class.bind(py))?,
                })
            })
            .collect::<PyResult<_>>()?;
        if facts
            .iter()
            .any(|fp| fp.members.iter().flatten().any(|(_, p)| *p >= n))
        {
            return Err(bad("a fact plan refers to no plan"));
        }
        let (corr_offset, body_disc, frame_words, members, by_class, member_names) = frame;
        let members = dense(members);
        let member_names = dense(member_names);
        if members.iter().flatten().any(|(_, p, _, _)| *p >= n) {
            return Err(bad("a frame member refers to no plan"));
        }
        Ok(Codec {
            plans,
            facts,
            corr_offset,
            body_disc,
            frame_words,
            members,
            member_names,
            bounds: bounds
                .bind(py)
                .downcast::<pyo3::types::PyModule>()?
                .dict()
                .unbind(),
            by_class: ByType::of(by_class.bind(py))?,
            envelope_slots: envelope_slots(py, &envelope.0, &envelope_names, slot_type)?,
            envelope: envelope.0,
            envelope_raw: envelope.1,
            envelope_names,
            memo: held((0..MEMO_SLOTS).map(|_| None).collect()),
            access,
            interned: held((0..INTERNED_SLOTS).map(|_| None).collect()),
            scratch: held(Vec::new()),
        })
    }

    /// `(class, read through slots, offsets)` of each plan: whether its values' fields are read and written through
    /// their slots, and where each slot was confirmed to sit in a value (`slot_offset`; 0: through its descriptor);
    /// then the envelope's, `corr` and `msg` (stored at their offsets when both are confirmed, else by name).
    fn slot_offsets<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyAny>, bool, Vec<isize>)> {
        let (at_corr, at_msg) = self.envelope_slots.unwrap_or((0, 0));
        let envelope = (
            self.envelope.bind(py).clone(),
            self.envelope_slots.is_some(),
            vec![at_corr, at_msg],
        );
        self.plans
            .iter()
            .map(|p| (p.cls.bind(py).clone(), p.slots, p.offsets.clone()))
            .chain(std::iter::once(envelope))
            .collect()
    }

    /// (Envelope, units spent) for `body`, or `Refused`. `budget` is the traversal limit in words.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        body: &[u8],
        budget: i64,
    ) -> PyResult<(Bound<'py, PyAny>, i64)> {
        self.read(py, body, budget, None)
    }

    /// `decode` for the frame at the start of `data` (a `bytes` or `bytearray` a link received: the frame's
    /// header, its body, maybe more): `(envelope, units, end)`, `end` where the frame ends in `data`; None when
    /// `data` does not hold the whole frame or its header says more than `max_frame` bytes. `Refused` before
    /// anything below the frame's head is read when its kind's class is not in `allowed` (a set of message classes)
    /// or the body is longer than its kind's bound (`bounds.max_body_bytes`: the kind's named bound if any,
    /// `max_frame` at most); the caller's reference path then gives the typed error (`OpcodeNotAllowed`,
    /// `FrameOverBounds`). The traversal limit is `codec._traversal_words` of the body.
    fn decode_framed<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
        allowed: &Bound<'py, PyAny>,
        max_frame: i64,
    ) -> PyResult<Option<(Bound<'py, PyAny>, i64, usize)>> {
        /// The frame's end in `bytes` when they hold all of it and its header says at most `max_frame`.
        fn end_of(bytes: &[u8], max_frame: i64) -> Option<usize> {
            let length = u64::from_le_bytes(bytes.get(..8)?.try_into().unwrap());
            let fits = length <= max_frame.max(0) as u64 && length <= (bytes.len() - 8) as u64;
            fits.then_some(8 + length as usize)
        }
        let copied: Vec<u8>;
        let (bytes, end): (&[u8], usize) = if let Ok(b) = data.downcast::<PyBytes>() {
            let bytes = b.as_bytes();
            let Some(end) = end_of(bytes, max_frame) else {
                return Ok(None);
            };
            (bytes, end)
        } else {
            let a = data
                .downcast::<pyo3::types::PyByteArray>()
                .map_err(|_| refused("not bytes"))?;
            // SAFETY: read and copied before any Python code runs (decoding runs the classes' __init__, which
            // must not find the buffer borrowed): the frame alone, not what follows it.
            let whole = unsafe { a.as_bytes() };
            let Some(end) = end_of(whole, max_frame) else {
                return Ok(None);
            };
            copied = whole[..end].to_vec();
            (&copied, end)
        };
        let body = &bytes[8..end];
        let budget = 2 * (body.len() / 8) as i64 + 64;
        let (envelope, units) = self.read(py, body, budget, Some((allowed, max_frame)))?;
        Ok(Some((envelope, units, end)))
    }

    /// The frame body carrying `msg` with correlation id `corr` (one segment), or `Refused`.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        msg: &Bound<'py, PyAny>,
        corr: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        // the frame as `encode_framed` writes it, less its header word
        self.frames(py, |o| self.put_frame(py, o, msg, corr, u64::MAX), 1)
    }

    /// What goes on the stream for `msg` with correlation id `corr`: the frame header (the body's length, 8
    /// bytes little-endian) and the body, written once; `Refused` when the body would pass `max_frame` bytes (or
    /// for anything `encode` refuses): the caller's reference path gives the typed error.
    fn encode_framed<'py>(
        &self,
        py: Python<'py>,
        msg: &Bound<'py, PyAny>,
        corr: u64,
        max_frame: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.frames(py, |o| self.put_frame(py, o, msg, corr, max_frame), 0)
    }

    /// `encode_framed` of each `(msg, corr)` of `items` (a list), one after the other in one `bytes`: what one
    /// write of them puts on the stream. `Refused` when `encode_framed` refuses any of them.
    fn encode_framed_many<'py>(
        &self,
        py: Python<'py>,
        items: &Bound<'py, pyo3::types::PyList>,
        max_frame: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.frames(
            py,
            |o| {
                for item in items.iter() {
                    // the pair is held (`item`) and a tuple never changes: its two items are borrowed
                    let pair = item
                        .downcast::<PyTuple>()
                        .ok()
                        .filter(|t| t.len() == 2)
                        .ok_or_else(|| refused("not a (msg, corr) pair"))?;
                    let msg = pair.get_borrowed_item(0)?;
                    let corr: u64 = pair
                        .get_borrowed_item(1)?
                        .extract()
                        .map_err(|_| refused("not a (msg, corr) pair"))?;
                    self.put_frame(py, o, &msg, corr, max_frame)?;
                }
                Ok(())
            },
            0,
        )
    }
}

/// `Codec::frames` keeps its buffer for the next call up to this many words (64 KiB); a larger one is dropped.
const SCRATCH_KEEP_WORDS: usize = 8192;

impl Codec {
    /// The `bytes` of the frames `write` puts into an empty `Out` (each by `put_frame`), less their first `skip`
    /// words. The words are written into the buffer the last call used (no allocation and no growing it again
    /// for frames of the usual size), then copied once into the `bytes`. Taken out of `scratch` for the call, not
    /// borrowed from it: Python code run by `write` (an enum's `__hash__`) may let another thread encode, which
    /// then finds no buffer there and makes its own.
    fn frames<'py>(
        &self,
        py: Python<'py>,
        write: impl FnOnce(&mut Out) -> PyResult<()>,
        skip: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut words = std::mem::take(&mut *self.scratch.get(py).borrow_mut());
        words.clear();
        let mut o = Out { words };
        let written = write(&mut o);
        let out = written.map(|()| bytes_of(py, &o.words[skip.min(o.words.len())..]));
        if o.words.capacity() <= SCRATCH_KEEP_WORDS {
            *self.scratch.get(py).borrow_mut() = o.words;
        }
        out
    }

    /// The frame for `msg` with `corr` appended to `o`: its header word (the body's length in bytes), the body's
    /// segment table (one segment: 0, then its length in words) and the segment's words; `Refused` when the body
    /// would pass `max_frame` bytes or `msg` is not written (what was appended is then of no use).
    fn put_frame(
        &self,
        py: Python<'_>,
        o: &mut Out,
        msg: &Bound<'_, PyAny>,
        corr: u64,
        max_frame: u64,
    ) -> PyResult<()> {
        let disc = self
            .by_class
            .get(msg)
            .ok_or_else(|| refused("not a wire message"))?;
        let Some(Some((ptr, plan, _, _))) = self.members.get(disc) else {
            return Err(refused("not a wire message"));
        };
        let head = o.alloc(2);
        // Pointers hold offsets relative to where they sit, so the segment starting at `base` instead of 0 changes
        // none of its words.
        let base = o.alloc(1); // the root pointer
        let root = o.new_struct(base, self.frame_words.0, self.frame_words.1);
        o.set_bits(&root, self.corr_offset, 64, corr);
        o.set_bits(&root, self.body_disc, 16, disc as u64);
        let p = &self.plans[*plan];
        let inner = o.new_struct(root.data + root.dw + *ptr as usize, p.dw, p.pc);
        self.put_struct(py, o, *plan, &inner, msg, None)?;
        let words = o.words.len() - base;
        if words > u32::MAX as usize {
            return Err(refused("message too large"));
        }
        let body = 8 + 8 * words as u64;
        if body > max_frame {
            return Err(refused("over the frame limit"));
        }
        o.words[head] = body; // little-endian on the wire, as every word (`bytes_of`)
        o.words[head + 1] = (words as u64) << 32; // segment count less one (0), then the segment's words
        Ok(())
    }
}

/// `words` as the stream carries them: each little-endian, one after the other, in one copy.
fn bytes_of<'py>(py: Python<'py>, words: &[u64]) -> Bound<'py, PyBytes> {
    if cfg!(target_endian = "little") {
        // SAFETY: any u64s are valid bytes; the slice covers exactly the words' memory, live for the call.
        let raw =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 8 * words.len()) };
        return PyBytes::new(py, raw);
    }
    let raw: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    PyBytes::new(py, &raw)
}

#[pymodule]
fn _fastwire(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Codec>()?;
    // The shape of the plans `Codec` takes; provisionerd/wire/native.py loads no other (a stale build).
    m.add("PLAN_VERSION", 6)?;
    m.add("Refused", m.py().get_type::<Refused>())?;
    Ok(())
}
