//! The collector's request message: an `EventBatch` checked on the wire and
//! kept as the bytes it came in, with a view of each event that borrows
//! them.
//!
//! The receiver must refuse a malformed batch before it acknowledges it.
//! [`WireBatch::from_wire`] decodes each event as a [`view::Event`] (its
//! strings borrowed, nothing allocated but the list of views): every field
//! has the wire type its schema says, every length fits, every string is
//! UTF-8. It reads what the receiver needs (the shim, the seqs, the largest
//! event, the longest correlation id) off the views, and the stage
//! correlates the same views ([`WireBatch::wire_events`]): each event is
//! parsed once, on the receiver's thread. Decoding the events with prost
//! there (a `String` per string field) made every one of those allocations
//! be freed on another thread, the correlation stage's: the allocator's
//! slowest path (`docs/BENCHMARKS.md`). [`WireBatch::decode_events`]
//! decodes them with prost, for tests and tools.
//!
//! The check accepts no more than prost does, so a batch it accepts always
//! decodes with prost to what the views say ([`tests`]): it is stricter in
//! two places prost's generated code is lenient and no shim writes: a map
//! field must be length-delimited, and fields of the deprecated group wire
//! type are refused.

use std::fmt;
use std::ops::RangeInclusive;

use prost::bytes::Bytes;
use prost::encoding::{WireType, decode_key, decode_varint};
use prost::{DecodeError, Message};

use std::sync::{Arc, LazyLock};

use crate::utf8::Strings;
use crate::v1::{Event, EventBatch, ShimInfo};
use crate::view::{self, Views, WireEvent};

/// Most events a batch may hold: the view of one takes a few hundred bytes
/// however short it is on the wire, so a batch of more is refused before
/// any is decoded (a collector's own limit, `max_events_per_batch`, is at
/// most this).
pub const MAX_EVENTS: usize = 65_536;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct WireBatch {
    views: Arc<Views>,
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
}

impl PartialEq for WireBatch {
    /// The same bytes (the rest is read off them).
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
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
    /// More than [`MAX_EVENTS`] events.
    TooManyEvents { events: usize },
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
            Self::TooManyEvents { events } => {
                write!(f, "{events} events in one batch, more than {MAX_EVENTS}")
            }
        }
    }
}

impl std::error::Error for WireError {}

impl From<WireError> for tonic::Status {
    /// Too many events is a limit (`RESOURCE_EXHAUSTED`, as the receiver's
    /// own limits are); anything else is a malformed message (`INTERNAL`,
    /// as prost's codec says).
    fn from(e: WireError) -> Self {
        match e {
            WireError::TooManyEvents { .. } => Self::resource_exhausted(e.to_string()),
            _ => Self::internal(e.to_string()),
        }
    }
}

impl From<DecodeError> for WireError {
    fn from(e: DecodeError) -> Self {
        Self::Decode(e)
    }
}

/// An `EventBatch` as it came off a stream, neither checked nor decoded:
/// what the ingest server receives. The receiver decodes it
/// ([`RawBatch::decode`]) once the pipeline has room for it, so that a
/// stream waiting for room holds the batch's bytes, not the views of its
/// events, which take several times more memory.
#[derive(Debug, Clone)]
pub struct RawBatch {
    bytes: Bytes,
    /// Its events, once counted: decoding does not count them again.
    events: std::cell::OnceCell<usize>,
}

impl RawBatch {
    /// The batch in `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        Self {
            bytes,
            events: std::cell::OnceCell::new(),
        }
    }

    /// How many events it holds, from its fields' keys and lengths alone;
    /// more than [`MAX_EVENTS`] is refused here, as decoding would.
    pub fn events(&self) -> Result<usize, WireError> {
        if let Some(&events) = self.events.get() {
            return Ok(events);
        }
        let events = count_events(&self.bytes)?;
        if events > MAX_EVENTS {
            return Err(WireError::TooManyEvents { events });
        }
        Ok(*self.events.get_or_init(|| events))
    }

    /// Checks and reads it ([`WireBatch::from_wire`]).
    pub fn decode(self) -> Result<WireBatch, WireError> {
        WireBatch::read_wire(self.bytes, self.events.get().copied())
    }

    /// Decodes the whole batch (for tests and tools).
    pub fn to_batch(&self) -> Result<EventBatch, DecodeError> {
        EventBatch::decode(&self.bytes[..])
    }
}

/// `EventBatch` with only its events: what the stage decodes.
#[derive(Clone, PartialEq, Message)]
struct BatchEvents {
    #[prost(message, repeated, tag = "2")]
    events: Vec<Event>,
}

/// What a batch holds until the views of its own events are made.
fn no_views() -> Arc<Views> {
    static NONE: LazyLock<Arc<Views>> =
        LazyLock::new(|| Arc::new(Views::new(Bytes::new(), |_| Vec::new())));
    Arc::clone(&NONE)
}

impl WireBatch {
    /// Checks `bytes` as an `EventBatch` and reads what the receiver needs
    /// (see the module docs).
    pub fn from_wire(bytes: Bytes) -> Result<Self, WireError> {
        Self::read_wire(bytes, None)
    }

    /// [`Self::from_wire`], its events already counted when `events` is
    /// given.
    fn read_wire(bytes: Bytes, events: Option<usize>) -> Result<Self, WireError> {
        let mut batch = Self {
            views: no_views(),
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
        };
        let views = Views::try_new(bytes, |bytes| batch.read(bytes, events))?;
        batch.views = Arc::new(views);
        Ok(batch)
    }

    /// The wire form of `batch`.
    pub fn encode(batch: &EventBatch) -> Result<Self, WireError> {
        Self::from_wire(Bytes::from(batch.encode_to_vec()))
    }

    /// The bytes it came in.
    pub fn bytes(&self) -> &Bytes {
        self.views.bytes()
    }

    /// Decodes the events. Cannot fail for a batch [`Self::from_wire`]
    /// accepted; an error here is a bug of its check.
    pub fn decode_events(&self) -> Result<Vec<Event>, DecodeError> {
        BatchEvents::decode(&self.bytes()[..]).map(|b| b.events)
    }

    /// The seqs of the events when they run in order without a gap
    /// (`first..=last`, as a shim sends them), if there are any.
    pub fn run(&self) -> Option<RangeInclusive<u64>> {
        let (first, last) = (self.first_seq?, self.last_seq?);
        let len = u64::try_from(self.events).ok()?;
        let gapless = last.checked_sub(first)?.checked_add(1)? == len;
        (self.increasing && gapless).then_some(first..=last)
    }

    /// The views of the events, in order: what the stage correlates from a
    /// batch it takes whole ([`WireBatch::run`]).
    pub fn views(&self) -> &[view::Event<'_>] {
        self.views.events()
    }

    /// The events, each its view and a reference to the batch that holds
    /// it: what the stage sequences and correlates ([`WireEvent`]) when it
    /// does not take the batch whole ([`WireBatch::run`]).
    pub fn wire_events(&self) -> Vec<WireEvent> {
        self.views
            .events()
            .iter()
            .enumerate()
            .map(|(index, event)| WireEvent::at(&self.views, index, event.seq))
            .collect()
    }

    /// Decodes the whole batch (for tests and tools; the collector uses
    /// the fields it read and [`Self::decode_events`]).
    pub fn to_batch(&self) -> Result<EventBatch, DecodeError> {
        EventBatch::decode(&self.bytes()[..])
    }

    /// The views of the events of the `EventBatch` `bytes`, the rest of
    /// its fields read into `self` (`events`: their number, when counted).
    fn read<'a>(
        &mut self,
        bytes: &'a Bytes,
        events: Option<usize>,
    ) -> Result<Vec<view::Event<'a>>, WireError> {
        let events = match events {
            Some(events) => events,
            None => count_events(bytes)?,
        };
        if events > MAX_EVENTS {
            return Err(WireError::TooManyEvents { events });
        }
        let mut views = Vec::with_capacity(events);
        let mut buf: &'a [u8] = bytes;
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            match tag {
                1 => {
                    let body = delimited(tag, wire_type, &mut buf)?;
                    self.shim.get_or_insert_default().merge(body)?;
                }
                2 => {
                    let body = delimited(tag, wire_type, &mut buf)?;
                    views.push(view::Event::default());
                    if let Some(event) = views.last_mut() {
                        event.read(body)?;
                        self.push(event, body.len());
                    }
                }
                3 => self.dropped_events = varint(tag, wire_type, &mut buf)?,
                4 => self.floor_seq = varint(tag, wire_type, &mut buf)?,
                5 => self.handoff = varint(tag, wire_type, &mut buf)? != 0,
                _ => skip(tag, wire_type, &mut buf)?,
            }
        }
        Ok(views)
    }

    fn push(&mut self, event: &view::Event<'_>, len: usize) {
        let seq = event.seq;
        self.events += 1;
        if self.last_seq.is_some_and(|last| last >= seq) {
            self.increasing = false;
        }
        self.first_seq.get_or_insert(seq);
        self.last_seq = Some(seq);
        if self.largest.is_none_or(|l| len > l.len) {
            self.largest = Some(LargestEvent { seq, len });
        }
        if let Some((field, len)) = event.ids.as_ref().and_then(longest_id)
            && self.longest_id.is_none_or(|l| len > l.len)
        {
            self.longest_id = Some(LongestId { seq, field, len });
        }
    }
}

/// How many events the `EventBatch` `bytes` holds, its other fields only
/// skipped (checked when read).
fn count_events(mut buf: &[u8]) -> Result<usize, WireError> {
    let mut events = 0;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        skip(tag, wire_type, &mut buf)?;
        events += usize::from(tag == 2);
    }
    Ok(events)
}

/// The longest of the correlation ids (the first of equals), if one is
/// not empty.
fn longest_id(ids: &view::Ids<'_>) -> Option<(&'static str, usize)> {
    let all = [
        ("session_id", ids.session_id),
        ("task_id", ids.task_id),
        ("turn_id", ids.turn_id),
        ("api_request_id", ids.api_request_id),
        ("tool_call_id", ids.tool_call_id),
        ("parent_session_id", ids.parent_session_id),
        ("parent_turn_id", ids.parent_turn_id),
        ("parent_subagent_id", ids.parent_subagent_id),
        ("child_session_id", ids.child_session_id),
        ("child_subagent_id", ids.child_subagent_id),
    ];
    all.into_iter().filter(|(_, id)| !id.is_empty()).fold(
        None,
        |longest: Option<(&'static str, usize)>, (field, id)| match longest {
            Some((_, len)) if len >= id.len() => longest,
            _ => Some((field, id.len())),
        },
    )
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
