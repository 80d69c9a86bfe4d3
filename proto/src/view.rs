//! Events read in place: [`Event`] borrows every string from the bytes it
//! was decoded from (or from a [`v1::Event`]), so correlating an event
//! copies only the strings the correlator keeps.
//!
//! The receiver decodes each event of a [`WireBatch`] this way as it
//! checks the batch, and the stage correlates the views it made
//! ([`WireEvent`]): each event is parsed once. Decoding them with prost
//! made a `String` of every string field, most of them read once and freed
//! on another thread.
//! The decoding follows prost's rules field by field, so a view of the
//! bytes is the view of prost's decoding of them ([`Event::to_event`],
//! held to it by the tests): the last value of a repeated scalar wins, a
//! repeated message field merges, a oneof field of another case replaces
//! the one before, the last entry of a map key wins.
//!
//! [`WireBatch`]: crate::wire::WireBatch

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use prost::bytes::Bytes;
use prost::encoding::{DecodeContext, WireType, decode_key};

use crate::utf8::Strings;
use crate::v1;
use crate::wire::{WireError, delimited, skip, text, varint};

/// An event as the correlator reads it: one of a batch's
/// ([`WireEvent`]) or an event decoded or built elsewhere
/// ([`v1::Event`]: tests, tools, the fuzz target).
pub trait Source {
    /// The event's seq.
    fn seq(&self) -> u64;
    /// The event, its strings borrowed. Cannot fail for an event of a batch
    /// [`WireBatch::from_wire`](crate::wire::WireBatch::from_wire)
    /// accepted (it made the view).
    fn view(&self) -> Result<Cow<'_, Event<'_>>, WireError>;
}

impl Source for v1::Event {
    fn seq(&self) -> u64 {
        self.seq
    }

    fn view(&self) -> Result<Cow<'_, Event<'_>>, WireError> {
        Ok(Cow::Owned(Event::from(self)))
    }
}

/// The views of a batch's events, which borrow its bytes ([`Views`]).
type EventList<'a> = Vec<Event<'a>>;

self_cell::self_cell!(
    /// A batch's bytes with the views of its events, made once when the
    /// batch was checked ([`WireBatch::from_wire`](crate::wire::WireBatch::from_wire)).
    pub(crate) struct Views {
        owner: Bytes,
        #[covariant]
        dependent: EventList,
    }

    impl {Debug}
);

impl Views {
    /// The batch's bytes.
    pub(crate) fn bytes(&self) -> &Bytes {
        self.borrow_owner()
    }

    /// The views of the batch's events, in order.
    pub(crate) fn events(&self) -> &[Event<'_>] {
        self.borrow_dependent()
    }
}

/// One event of a [`WireBatch`](crate::wire::WireBatch): its view, made
/// when the batch was checked, and a reference to the batch that holds it
/// (not a copy).
#[derive(Debug, Clone)]
pub struct WireEvent {
    seq: u64,
    views: Arc<Views>,
    index: usize,
}

impl WireEvent {
    /// The event encoded in `bytes`, decoded.
    pub fn new(bytes: Bytes) -> Result<Self, WireError> {
        let views = Views::try_new(bytes, |bytes| Event::decode(bytes).map(|e| vec![e]))?;
        let views = Arc::new(views);
        let seq = views.events().first().map_or(0, |e| e.seq);
        Ok(Self::at(&views, 0, seq))
    }

    /// Event `index` of `views`, whose seq is `seq`.
    pub(crate) fn at(views: &Arc<Views>, index: usize, seq: u64) -> Self {
        Self {
            seq,
            views: Arc::clone(views),
            index,
        }
    }

    fn event(&self) -> Option<&Event<'_>> {
        self.views.events().get(self.index)
    }
}

impl Source for WireEvent {
    fn seq(&self) -> u64 {
        self.seq
    }

    fn view(&self) -> Result<Cow<'_, Event<'_>>, WireError> {
        // Made with the batch at `index`: never missing.
        self.event().map(Cow::Borrowed).ok_or(WireError::Truncated)
    }
}

/// `hermes.collector.v1.Event`, its strings borrowed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event<'a> {
    pub seq: u64,
    pub hook: &'a str,
    pub schema_version: &'a str,
    pub time_unix_nano: u64,
    pub mono_nano: u64,
    pub thread: &'a str,
    pub ids: Option<Ids<'a>>,
    pub body: Option<Body<'a>>,
    pub content: Content<'a>,
}

/// `Event.body`. The two large cases are boxed, as prost's are: a batch
/// keeps a view of every event until the stage has correlated them, and
/// inline they would make every view as large as an API call's (592
/// bytes instead of 336), more memory to fill on the receiver's thread
/// and to read on the stage's (`docs/BENCHMARKS.md`).
#[derive(Debug, Clone, PartialEq)]
pub enum Body<'a> {
    Session(Session<'a>),
    Turn(Turn<'a>),
    Api(Box<ApiCall<'a>>),
    Tool(ToolCall<'a>),
    Subagent(Subagent<'a>),
    Approval(Box<Approval<'a>>),
    Other(Other<'a>),
}

/// `Event.content`: read from the event's bytes when asked for a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Content<'a> {
    /// The encoded event (its entries were checked when it was decoded).
    Wire(&'a [u8]),
    Map(&'a HashMap<String, String>),
}

impl Default for Content<'_> {
    fn default() -> Self {
        Self::Wire(&[])
    }
}

impl<'a> Content<'a> {
    /// The value of `key` (the last entry of it).
    pub fn get(&self, key: &str) -> Option<&'a str> {
        match self {
            Self::Map(map) => map.get(key).map(String::as_str),
            Self::Wire(bytes) => {
                let mut found = None;
                for_each_entry(bytes, |k, v| {
                    if k == key {
                        found = Some(v);
                    }
                })
                .ok()?;
                found
            }
        }
    }

    /// Every entry, the last of each key.
    pub fn to_map(&self) -> HashMap<String, String> {
        match self {
            Self::Map(map) => (*map).clone(),
            Self::Wire(bytes) => {
                let mut map = HashMap::new();
                // Checked at decoding: no error left to meet.
                let _ = for_each_entry(bytes, |k, v| {
                    map.insert(k.to_owned(), v.to_owned());
                });
                map
            }
        }
    }
}

/// Calls `each` with the key and value of every `content` entry of the
/// encoded event `bytes`, in order.
fn for_each_entry<'a>(
    mut bytes: &'a [u8],
    mut each: impl FnMut(&'a str, &'a str),
) -> Result<(), WireError> {
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes)?;
        if tag != 20 {
            skip(tag, wire_type, &mut bytes)?;
            continue;
        }
        let mut entry = delimited(tag, wire_type, &mut bytes)?;
        let strings = Strings::new(entry);
        let (mut key, mut value) = ("", "");
        while !entry.is_empty() {
            let (tag, wire_type) = decode_key(&mut entry)?;
            match tag {
                1 => key = text(&strings, tag, wire_type, &mut entry)?,
                2 => value = text(&strings, tag, wire_type, &mut entry)?,
                _ => skip(tag, wire_type, &mut entry)?,
            }
        }
        each(key, value);
    }
    Ok(())
}

impl<'a> Event<'a> {
    /// Decodes the encoded event `bytes`.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, WireError> {
        let mut event = Self::default();
        event.read(bytes)?;
        Ok(event)
    }

    /// Reads the encoded event `bytes` into `self`, a default event, in
    /// place: a batch's views are read into their vector's slots, not
    /// moved there (an event is a few hundred bytes).
    pub(crate) fn read(&mut self, bytes: &'a [u8]) -> Result<(), WireError> {
        let event = self;
        event.content = Content::Wire(bytes);
        let mut entries = false;
        let strings = Strings::each(bytes);
        let mut buf = bytes;
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            let b = &mut buf;
            match tag {
                1 => event.seq = varint(tag, wire_type, b)?,
                2 => event.hook = text(&strings, tag, wire_type, b)?,
                3 => event.schema_version = text(&strings, tag, wire_type, b)?,
                4 => event.time_unix_nano = fixed64(tag, wire_type, b)?,
                5 => event.mono_nano = fixed64(tag, wire_type, b)?,
                6 => event.thread = text(&strings, tag, wire_type, b)?,
                7 => {
                    let body = delimited(tag, wire_type, b)?;
                    event.ids.get_or_insert_default().merge(body)?;
                }
                10..=16 => {
                    let body = delimited(tag, wire_type, b)?;
                    event.merge_body(tag, body)?;
                }
                20 => {
                    delimited(tag, wire_type, b)?;
                    entries = true;
                }
                _ => skip(tag, wire_type, b)?,
            }
        }
        if entries {
            for_each_entry(bytes, |_, _| {})?;
        } else {
            // Nothing to look for at each `get`.
            event.content = Content::default();
        }
        Ok(())
    }

    /// `body` with the message of oneof field `tag` merged in.
    fn merge_body(&mut self, tag: u32, bytes: &'a [u8]) -> Result<(), WireError> {
        // A new body is read where it stays (a boxed one in its box), not
        // moved there.
        macro_rules! merge {
            ($case:ident, $new:expr) => {
                match &mut self.body {
                    Some(Body::$case(body)) => body.merge(bytes),
                    body => {
                        // Always the case just inserted.
                        let Body::$case(new) = body.insert(Body::$case($new)) else {
                            return Ok(());
                        };
                        new.merge(bytes)
                    }
                }
            };
        }
        match tag {
            10 => merge!(Session, Session::default()),
            11 => merge!(Turn, Turn::default()),
            12 => merge!(Api, Box::default()),
            13 => merge!(Tool, ToolCall::default()),
            14 => merge!(Subagent, Subagent::default()),
            15 => merge!(Approval, Box::default()),
            _ => merge!(Other, Other::default()),
        }
    }

    /// The event as prost's message, every string copied.
    pub fn to_event(&self) -> v1::Event {
        v1::Event {
            seq: self.seq,
            hook: self.hook.to_owned(),
            schema_version: self.schema_version.to_owned(),
            time_unix_nano: self.time_unix_nano,
            mono_nano: self.mono_nano,
            thread: self.thread.to_owned(),
            ids: self.ids.as_ref().map(|ids| Box::new(ids.to_owned())),
            body: self.body.as_ref().map(|body| match body {
                Body::Session(b) => v1::event::Body::Session(b.to_owned()),
                Body::Turn(b) => v1::event::Body::Turn(b.to_owned()),
                Body::Api(b) => v1::event::Body::Api(Box::new(ApiCall::to_owned(b))),
                Body::Tool(b) => v1::event::Body::Tool(b.to_owned()),
                Body::Subagent(b) => v1::event::Body::Subagent(b.to_owned()),
                Body::Approval(b) => v1::event::Body::Approval(Box::new(Approval::to_owned(b))),
                Body::Other(b) => v1::event::Body::Other(b.to_owned()),
            }),
            content: self.content.to_map(),
        }
    }
}

impl<'a> From<&'a v1::Event> for Event<'a> {
    fn from(e: &'a v1::Event) -> Self {
        Self {
            seq: e.seq,
            hook: &e.hook,
            schema_version: &e.schema_version,
            time_unix_nano: e.time_unix_nano,
            mono_nano: e.mono_nano,
            thread: &e.thread,
            ids: e.ids.as_deref().map(Ids::from),
            body: e.body.as_ref().map(|body| match body {
                v1::event::Body::Session(b) => Body::Session(b.into()),
                v1::event::Body::Turn(b) => Body::Turn(b.into()),
                v1::event::Body::Api(b) => Body::Api(Box::new(b.as_ref().into())),
                v1::event::Body::Tool(b) => Body::Tool(b.into()),
                v1::event::Body::Subagent(b) => Body::Subagent(b.into()),
                v1::event::Body::Approval(b) => Body::Approval(Box::new(b.as_ref().into())),
                v1::event::Body::Other(b) => Body::Other(b.into()),
            }),
            content: Content::Map(&e.content),
        }
    }
}

/// A view's fields: each one's tag, name and kind.
#[cfg(test)]
pub(crate) type Fields = &'static [(u32, &'static str, &'static str)];

/// A message of the event as a struct of its fields, each of a kind: `str`
/// (borrowed), `strs` (a repeated string), a scalar kind of prost's
/// (`uint64`, `uint32`, `fixed64`, and `opt_` for proto3's `optional`), or
/// `usage` (the `Usage` message, which has no strings). Generates the
/// decoding, the borrowing from prost's message and the copy back to it.
macro_rules! view {
    ($(#[$doc:meta])* $name:ident { $($tag:literal => $field:ident: $kind:ident,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct $name<'a> {
            $(pub $field: view!(@ty $kind),)*
        }

        impl<'a> $name<'a> {
            /// Each field's tag, name and kind (held to the `.proto` file
            /// by the tests).
            #[cfg(test)]
            pub(crate) const FIELDS: Fields = &[$(($tag, stringify!($field), stringify!($kind)),)*];

            fn merge(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
                let strings = Strings::new(buf);
                while !buf.is_empty() {
                    let (tag, wire_type) = decode_key(&mut buf)?;
                    match tag {
                        $($tag => view!(@merge $kind, self.$field, strings, tag, wire_type, &mut buf),)*
                        _ => skip(tag, wire_type, &mut buf)?,
                    }
                }
                Ok(())
            }

            /// The message as prost's, every string copied.
            pub fn to_owned(&self) -> v1::$name {
                v1::$name {
                    $($field: view!(@own $kind, self.$field),)*
                }
            }
        }

        impl<'a> From<&'a v1::$name> for $name<'a> {
            fn from(m: &'a v1::$name) -> Self {
                Self {
                    $($field: view!(@borrow $kind, m.$field),)*
                }
            }
        }
    };
    (@ty str) => { &'a str };
    (@ty strs) => { Vec<&'a str> };
    (@ty usage) => { Option<v1::Usage> };
    (@ty opt_bool) => { Option<bool> };
    (@ty opt_uint64) => { Option<u64> };
    (@ty opt_int32) => { Option<i32> };
    (@ty uint64) => { u64 };
    (@ty fixed64) => { u64 };
    (@ty uint32) => { u32 };
    (@merge str, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        $slot = text(&$s, $tag, $wt, $buf)?
    };
    (@merge strs, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        $slot.push(text(&$s, $tag, $wt, $buf)?)
    };
    (@merge usage, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        prost_merge($slot.get_or_insert_default(), delimited($tag, $wt, $buf)?)?
    };
    (@merge opt_bool, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        prost::encoding::bool::merge(
            $wt,
            $slot.get_or_insert_default(),
            $buf,
            DecodeContext::default(),
        )?
    };
    (@merge opt_uint64, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        prost::encoding::uint64::merge(
            $wt,
            $slot.get_or_insert_default(),
            $buf,
            DecodeContext::default(),
        )?
    };
    (@merge opt_int32, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        prost::encoding::int32::merge(
            $wt,
            $slot.get_or_insert_default(),
            $buf,
            DecodeContext::default(),
        )?
    };
    (@merge uint64, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        $slot = varint($tag, $wt, $buf)?
    };
    (@merge fixed64, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        $slot = fixed64($tag, $wt, $buf)?
    };
    (@merge uint32, $slot:expr, $s:ident, $tag:ident, $wt:ident, $buf:expr) => {
        prost::encoding::uint32::merge($wt, &mut $slot, $buf, DecodeContext::default())?
    };
    (@own str, $v:expr) => { $v.to_owned() };
    (@own strs, $v:expr) => { $v.iter().map(|s| (*s).to_owned()).collect() };
    (@own $kind:ident, $v:expr) => { $v };
    (@borrow str, $v:expr) => { &$v };
    (@borrow strs, $v:expr) => { $v.iter().map(String::as_str).collect() };
    (@borrow $kind:ident, $v:expr) => { $v };
}

view! {
    /// `Ids`.
    Ids {
        1 => session_id: str,
        2 => task_id: str,
        3 => turn_id: str,
        4 => api_request_id: str,
        5 => tool_call_id: str,
        6 => parent_session_id: str,
        7 => parent_turn_id: str,
        8 => parent_subagent_id: str,
        9 => child_session_id: str,
        10 => child_subagent_id: str,
    }
}

view! {
    /// `Session`.
    Session {
        1 => model: str,
        2 => platform: str,
        3 => reason: str,
        4 => old_session_id: str,
        5 => new_session_id: str,
    }
}

view! {
    /// `Turn`.
    Turn {
        1 => model: str,
        2 => platform: str,
        3 => is_first_turn: opt_bool,
        4 => completed: opt_bool,
        5 => interrupted: opt_bool,
        6 => reason: str,
        7 => sender_id: str,
    }
}

view! {
    /// `ApiCall`.
    ApiCall {
        1 => model: str,
        2 => platform: str,
        3 => provider: str,
        4 => base_url: str,
        5 => api_mode: str,
        6 => api_call_count: uint64,
        7 => max_tokens: opt_uint64,
        8 => started_at_unix_nano: fixed64,
        9 => ended_at_unix_nano: fixed64,
        10 => api_duration_nano: uint64,
        11 => attempt: uint32,
        12 => finish_reason: str,
        13 => response_model: str,
        14 => usage: usage,
        15 => message_count: uint64,
        16 => tool_count: uint64,
        17 => assistant_tool_call_count: uint64,
        18 => status_code: opt_int32,
        19 => retryable: opt_bool,
        20 => reason: str,
        21 => error_type: str,
        22 => error_message: str,
        23 => retry_count: uint32,
        24 => max_retries: uint32,
        25 => approx_input_tokens: uint64,
        26 => request_char_count: uint64,
    }
}

view! {
    /// `ToolCall`.
    ToolCall {
        1 => tool_name: str,
        2 => status: str,
        3 => duration_ms: opt_uint64,
        4 => error_type: str,
        5 => error_message: str,
    }
}

view! {
    /// `Subagent`.
    Subagent {
        1 => child_role: str,
        2 => child_status: str,
        3 => duration_ms: opt_uint64,
        4 => child_goal: str,
        5 => child_summary: str,
    }
}

view! {
    /// `Approval`.
    Approval {
        1 => pattern_key: str,
        2 => pattern_keys: strs,
        3 => surface: str,
        4 => choice: str,
        5 => decided_by: str,
        6 => session_key: str,
        7 => command: str,
        8 => description: str,
    }
}

/// `Other`: the fields of a hook this release does not know, by key (the
/// last entry of each); their values decoded as prost does (copied: these
/// events are rare).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Other<'a> {
    pub fields: BTreeMap<&'a str, v1::Scalar>,
}

impl<'a> Other<'a> {
    fn merge(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag != 1 {
                skip(tag, wire_type, &mut buf)?;
                continue;
            }
            let mut entry = delimited(tag, wire_type, &mut buf)?;
            let strings = Strings::new(entry);
            let (mut key, mut value) = ("", v1::Scalar::default());
            while !entry.is_empty() {
                let (tag, wire_type) = decode_key(&mut entry)?;
                match tag {
                    1 => key = text(&strings, tag, wire_type, &mut entry)?,
                    2 => prost_merge(&mut value, delimited(tag, wire_type, &mut entry)?)?,
                    _ => skip(tag, wire_type, &mut entry)?,
                }
            }
            self.fields.insert(key, value);
        }
        Ok(())
    }

    /// The message as prost's.
    pub fn to_owned(&self) -> v1::Other {
        v1::Other {
            fields: self
                .fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }
}

impl<'a> From<&'a v1::Other> for Other<'a> {
    fn from(m: &'a v1::Other) -> Self {
        Self {
            fields: m
                .fields
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect(),
        }
    }
}

/// Merges the encoded message `bytes` (of a type without strings) into
/// `message` with prost, refusing groups as the rest of the decoding does
/// (prost skips them).
fn prost_merge(message: &mut impl prost::Message, mut bytes: &[u8]) -> Result<(), WireError> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let (tag, wire_type) = decode_key(&mut rest)?;
        skip(tag, wire_type, &mut rest)?;
    }
    message.merge(&mut bytes)?;
    Ok(())
}

fn fixed64(tag: u32, wire_type: WireType, buf: &mut &[u8]) -> Result<u64, WireError> {
    crate::wire::expect(tag, wire_type, WireType::SixtyFourBit)?;
    let (value, rest) = buf.split_first_chunk::<8>().ok_or(WireError::Truncated)?;
    *buf = rest;
    Ok(u64::from_le_bytes(*value))
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
