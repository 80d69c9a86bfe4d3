//! The collector's request message: an `EventBatch` checked on the wire and
//! kept as the bytes it came in, its events decoded where they are used.
//!
//! The receiver must refuse a malformed batch before it acknowledges it,
//! but decoding the events there (a `String` per string field) made every
//! one of those allocations be freed on another thread, the correlation
//! stage's, where they are consumed: the allocator's slowest path
//! (`docs/BENCHMARKS.md`). [`WireBatch::from_wire`] walks the message once
//! without allocating: every field of every event has the wire type its
//! schema says, every length fits, every string is UTF-8; and it reads
//! what the receiver needs (the shim, the seqs, the largest event, the
//! longest correlation id). The stage then reads each event in place
//! ([`WireBatch::wire_events`], [`crate::view`]); [`WireBatch::decode_events`]
//! decodes them with prost, for tests and tools.
//!
//! The walk accepts no more than prost does, so a batch it accepts always
//! decodes, with prost and as views ([`tests`]): it is stricter in two places prost's
//! generated code is lenient and no shim writes: a map field must be
//! length-delimited, and fields of the deprecated group wire type are
//! refused (which also keeps the walk's depth at the schema's five
//! levels).

use std::fmt;

use prost::bytes::Bytes;
use prost::encoding::{WireType, decode_key, decode_varint};
use prost::{DecodeError, Message};

use crate::utf8::Strings;
use crate::v1::{Event, EventBatch, ShimInfo};
use crate::view::WireEvent;

/// See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct WireBatch {
    bytes: Bytes,
    pub shim: Option<ShimInfo>,
    pub dropped_events: u64,
    pub floor_seq: u64,
    pub handoff: bool,
    /// How many events the batch holds.
    pub events: usize,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Every event's seq is above the one before it.
    pub increasing: bool,
    /// The largest event (the first of equals).
    pub largest: Option<LargestEvent>,
    /// The longest correlation id of any event (the first of equals).
    pub longest_id: Option<LongestId>,
    /// Each event's seq and where its bytes are in `bytes`.
    at: Vec<(u64, std::ops::Range<usize>)>,
}

/// An event of a batch and its length on the wire (without the field's key
/// and length prefix): what prost writes for it (`encoded_len`) for a
/// batch prost encoded, and never less for any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargestEvent {
    pub seq: u64,
    pub len: usize,
}

/// A correlation id (a field of `Ids`) and the event that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongestId {
    pub seq: u64,
    /// The `Ids` field's name.
    pub field: &'static str,
    pub len: usize,
}

/// Why bytes are not an `EventBatch` the collector accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum WireError {
    /// What prost's own readers refused (a bad varint or key).
    Decode(DecodeError),
    /// A known field with another wire type than its schema's.
    WireType { tag: u32, found: WireType },
    /// A length or a fixed-size value past the end of its message.
    Truncated,
    /// A string field that is not UTF-8.
    NotUtf8 { tag: u32 },
    /// A field of the group wire type.
    Group { tag: u32 },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // prost's own text starts "failed to decode Protobuf message".
            Self::Decode(e) => e.fmt(f),
            Self::WireType { tag, found } => {
                write!(f, "field {tag}: invalid wire type {found:?}")
            }
            Self::Truncated => f.write_str("truncated message (a length past its end)"),
            Self::NotUtf8 { tag } => write!(f, "field {tag}: string is not valid UTF-8"),
            Self::Group { tag } => write!(f, "field {tag}: groups are not accepted"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<DecodeError> for WireError {
    fn from(e: DecodeError) -> Self {
        Self::Decode(e)
    }
}

/// `EventBatch` with only its events: what the stage decodes.
#[derive(Clone, PartialEq, Message)]
struct BatchEvents {
    #[prost(message, repeated, tag = "2")]
    events: Vec<Event>,
}

impl WireBatch {
    /// Checks `bytes` as an `EventBatch` and reads what the receiver needs
    /// (see the module docs).
    pub fn from_wire(bytes: Bytes) -> Result<Self, WireError> {
        let mut batch = Self {
            bytes: Bytes::new(),
            shim: None,
            dropped_events: 0,
            floor_seq: 0,
            handoff: false,
            events: 0,
            first_seq: None,
            last_seq: None,
            increasing: true,
            largest: None,
            longest_id: None,
            at: Vec::new(),
        };
        let mut buf: &[u8] = &bytes;
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            match tag {
                1 => {
                    let body = delimited(tag, wire_type, &mut buf)?;
                    batch.shim.get_or_insert_default().merge(body)?;
                }
                2 => {
                    let mut body = delimited(tag, wire_type, &mut buf)?;
                    let len = body.len();
                    let end = bytes.len() - buf.len();
                    let mut event = Seen::default();
                    walk(&mut body, EVENT, &mut event)?;
                    batch.at.push((event.seq, end - len..end));
                    batch.push(event, len);
                }
                3 => batch.dropped_events = varint(tag, wire_type, &mut buf)?,
                4 => batch.floor_seq = varint(tag, wire_type, &mut buf)?,
                5 => batch.handoff = varint(tag, wire_type, &mut buf)? != 0,
                _ => skip(tag, wire_type, &mut buf)?,
            }
        }
        batch.bytes = bytes;
        Ok(batch)
    }

    /// The wire form of `batch`.
    pub fn encode(batch: &EventBatch) -> Result<Self, WireError> {
        Self::from_wire(Bytes::from(batch.encode_to_vec()))
    }

    /// The bytes it came in.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Decodes the events. Cannot fail for a batch [`Self::from_wire`]
    /// accepted; an error here is a bug of the walk.
    pub fn decode_events(&self) -> Result<Vec<Event>, DecodeError> {
        BatchEvents::decode(&self.bytes[..]).map(|b| b.events)
    }

    /// The events, each kept as its bytes (a reference to the batch's,
    /// not a copy) with the seq the walk read: what the stage sequences and
    /// views ([`WireEvent`]).
    pub fn wire_events(&self) -> Vec<WireEvent> {
        self.at
            .iter()
            .map(|(seq, range)| WireEvent::at(*seq, self.bytes.slice(range.clone())))
            .collect()
    }

    /// Decodes the whole batch (for tests and tools; the collector uses
    /// the fields it read and [`Self::decode_events`]).
    pub fn to_batch(&self) -> Result<EventBatch, DecodeError> {
        EventBatch::decode(&self.bytes[..])
    }

    fn push(&mut self, event: Seen, len: usize) {
        self.events += 1;
        if self.last_seq.is_some_and(|last| last >= event.seq) {
            self.increasing = false;
        }
        self.first_seq.get_or_insert(event.seq);
        self.last_seq = Some(event.seq);
        if self.largest.is_none_or(|l| len > l.len) {
            self.largest = Some(LargestEvent {
                seq: event.seq,
                len,
            });
        }
        if let Some((field, len)) = event.longest_id
            && self.longest_id.is_none_or(|l| len > l.len)
        {
            self.longest_id = Some(LongestId {
                seq: event.seq,
                field,
                len,
            });
        }
    }
}

/// What a walk over one event found.
#[derive(Debug, Default)]
struct Seen {
    seq: u64,
    longest_id: Option<(&'static str, usize)>,
}

/// What the schema says of one field. A message's schema is a table
/// indexed by tag; a tag past its end or [`Kind::Unknown`] is unknown.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Unknown,
    Varint,
    Fixed64,
    Text,
    /// A string that is a correlation id: its length is kept.
    Id(&'static str),
    /// The event's seq (a varint): its value is kept.
    Seq,
    Message(&'static [Kind]),
}

use Kind::{Fixed64 as F64, Message as M, Text as S, Unknown as U, Varint as V};

const EVENT: &[Kind] = &[
    U,
    Kind::Seq,
    S,
    S,
    F64,
    F64,
    S,
    M(IDS),
    U,
    U,
    M(SESSION),
    M(TURN),
    M(API_CALL),
    M(TOOL_CALL),
    M(SUBAGENT),
    M(APPROVAL),
    M(OTHER),
    U,
    U,
    U,
    M(STRING_ENTRY),
];
const IDS: &[Kind] = &[
    U,
    Kind::Id("session_id"),
    Kind::Id("task_id"),
    Kind::Id("turn_id"),
    Kind::Id("api_request_id"),
    Kind::Id("tool_call_id"),
    Kind::Id("parent_session_id"),
    Kind::Id("parent_turn_id"),
    Kind::Id("parent_subagent_id"),
    Kind::Id("child_session_id"),
    Kind::Id("child_subagent_id"),
];
const SESSION: &[Kind] = &[U, S, S, S, S, S];
const TURN: &[Kind] = &[U, S, S, V, V, V, S, S];
const USAGE: &[Kind] = &[U, V, V, V, V, V, V, V, V];
const API_CALL: &[Kind] = &[
    U,
    S,
    S,
    S,
    S,
    S,
    V,
    V,
    F64,
    F64,
    V,
    V,
    S,
    S,
    M(USAGE),
    V,
    V,
    V,
    V,
    V,
    S,
    S,
    S,
    V,
    V,
    V,
    V,
];
const TOOL_CALL: &[Kind] = &[U, S, S, V, S, S];
const SUBAGENT: &[Kind] = &[U, S, S, V, S, S];
const APPROVAL: &[Kind] = &[U, S, S, S, S, S, S, S, S];
const OTHER: &[Kind] = &[U, M(SCALAR_ENTRY)];
const SCALAR_ENTRY: &[Kind] = &[U, S, M(SCALAR)];
const SCALAR: &[Kind] = &[U, S, V, V, F64];
const STRING_ENTRY: &[Kind] = &[U, S, S];

/// Walks the fields of one message that fills `buf`.
fn walk(buf: &mut &[u8], schema: &[Kind], seen: &mut Seen) -> Result<(), WireError> {
    let strings = if std::ptr::eq(schema, EVENT) {
        Strings::each(buf)
    } else {
        Strings::new(buf)
    };
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(buf)?;
        let kind = usize::try_from(tag)
            .ok()
            .and_then(|i| schema.get(i))
            .copied()
            .unwrap_or(Kind::Unknown);
        match kind {
            Kind::Unknown => skip(tag, wire_type, buf)?,
            Kind::Varint => {
                varint(tag, wire_type, buf)?;
            }
            Kind::Seq => seen.seq = varint(tag, wire_type, buf)?,
            Kind::Fixed64 => {
                expect(tag, wire_type, WireType::SixtyFourBit)?;
                advance(buf, 8)?;
            }
            Kind::Text => {
                text(&strings, tag, wire_type, buf)?;
            }
            Kind::Id(field) => {
                let len = text(&strings, tag, wire_type, buf)?.len();
                if seen.longest_id.is_none_or(|(_, l)| len > l) {
                    seen.longest_id = Some((field, len));
                }
            }
            Kind::Message(fields) => {
                let mut body = delimited(tag, wire_type, buf)?;
                walk(&mut body, fields, seen)?;
            }
        }
    }
    Ok(())
}

pub(crate) fn expect(tag: u32, found: WireType, expected: WireType) -> Result<(), WireError> {
    if found == expected {
        Ok(())
    } else {
        Err(WireError::WireType { tag, found })
    }
}

pub(crate) fn varint(tag: u32, wire_type: WireType, buf: &mut &[u8]) -> Result<u64, WireError> {
    expect(tag, wire_type, WireType::Varint)?;
    Ok(decode_varint(buf)?)
}

fn advance(buf: &mut &[u8], len: usize) -> Result<(), WireError> {
    let rest = buf.get(len..).ok_or(WireError::Truncated)?;
    *buf = rest;
    Ok(())
}

/// The body of a length-delimited field; `buf` moves past it.
pub(crate) fn delimited<'a>(
    tag: u32,
    wire_type: WireType,
    buf: &mut &'a [u8],
) -> Result<&'a [u8], WireError> {
    expect(tag, wire_type, WireType::LengthDelimited)?;
    let len = usize::try_from(decode_varint(buf)?).map_err(|_| WireError::Truncated)?;
    let whole: &'a [u8] = buf;
    let (body, rest) = whole.split_at_checked(len).ok_or(WireError::Truncated)?;
    *buf = rest;
    Ok(body)
}

/// A string field of the message of `strings`, borrowed.
pub(crate) fn text<'a>(
    strings: &Strings<'a>,
    tag: u32,
    wire_type: WireType,
    buf: &mut &'a [u8],
) -> Result<&'a str, WireError> {
    let body = delimited(tag, wire_type, buf)?;
    strings.get(body).ok_or(WireError::NotUtf8 { tag })
}

/// Skips an unknown field as prost does, except groups (module docs).
pub(crate) fn skip(tag: u32, wire_type: WireType, buf: &mut &[u8]) -> Result<(), WireError> {
    match wire_type {
        WireType::Varint => {
            decode_varint(buf)?;
        }
        WireType::SixtyFourBit => advance(buf, 8)?,
        WireType::ThirtyTwoBit => advance(buf, 4)?,
        WireType::LengthDelimited => {
            delimited(tag, wire_type, buf)?;
        }
        WireType::StartGroup | WireType::EndGroup => return Err(WireError::Group { tag }),
    }
    Ok(())
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
