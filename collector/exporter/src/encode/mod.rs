//! Protobuf encoding of an OTLP `ExportTraceServiceRequest` in two passes,
//! from the collector's span model (`hermes_span`, which prost does not
//! encode: every message but `Status` is written here).
//!
//! prost writes a nested message's length before the message, and computes
//! it by walking the message; it does so again at every level of nesting, so
//! the attributes of a span are measured once per enclosing message (request,
//! resource, scope, span): four to five walks before the bytes are written.
//! Under load that was the larger part of the export encoding
//! (`docs/BENCHMARKS.md`, collector profile). This module measures every
//! message that holds repeated messages once, records the lengths in
//! pre-order, and writes the bytes in a second pass that reads them back;
//! the lengths of a span's attribute values are recorded there too, and the
//! attributes of everything else (events, links, resource, scope, nested
//! lists: few) are measured where they are written.
//!
//! Invariant: the bytes are exactly prost's for the same request in
//! `opentelemetry_proto`'s messages (fields in tag order, proto3 defaults
//! skipped, oneof values always written); the tests compare both encodings on
//! edge cases and generated requests, and the criterion bench
//! `otlp_encode` on the fixtures' spans before it times them.

use bytes::BufMut;
use hermes_span::collector::trace::v1::ExportTraceServiceRequest;
use hermes_span::common::v1::any_value::Value;
use hermes_span::common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use prost::Message;

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// Encodes `request` into a new buffer of exactly its encoded size.
pub fn encode_request(request: &ExportTraceServiceRequest) -> Vec<u8> {
    Lengths::of(request).encode(request)
}

/// The encoded lengths of one request's nested messages, in pre-order.
#[derive(Debug)]
pub(crate) struct Lengths {
    /// Encoded size of the whole request.
    total: usize,
    lens: Vec<usize>,
}

impl Lengths {
    /// Measures `request` (the first pass).
    pub(crate) fn of(request: &ExportTraceServiceRequest) -> Self {
        let mut lens = Vec::new();
        let total = request
            .resource_spans
            .iter()
            .map(|rs| nested(1, measure_resource_spans(rs, &mut lens)))
            .sum();
        Self { total, lens }
    }

    /// The first pass from spans measured beforehand: `measured` holds one
    /// entry per `ScopeSpans` of `request`, in order, measured from its
    /// spans. The resources and scopes (one each per batch, usually) are
    /// measured here.
    pub(crate) fn with_spans(
        request: &ExportTraceServiceRequest,
        measured: impl IntoIterator<Item = MeasuredSpans>,
    ) -> Self {
        let mut measured = measured.into_iter();
        let mut lens = Vec::new();
        let mut total = 0;
        for rs in &request.resource_spans {
            let rs_at = lens.len();
            lens.push(0);
            let mut rs_len = rs
                .resource
                .as_ref()
                .map_or(0, |r| nested(1, resource_len(r)))
                + bytes_len(3, rs.schema_url.as_bytes());
            for ss in &rs.scope_spans {
                let spans = measured.next().unwrap_or_default();
                let ss_len = ss.scope.as_ref().map_or(0, |s| nested(1, scope_len(s)))
                    + spans.len
                    + bytes_len(3, ss.schema_url.as_bytes());
                lens.push(ss_len);
                lens.extend_from_slice(&spans.lens);
                rs_len += nested(2, ss_len);
            }
            lens[rs_at] = rs_len;
            total += nested(1, rs_len);
        }
        Self { total, lens }
    }

    /// Encoded size of the whole request.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Encodes `request`, which must be the request measured (the second
    /// pass), into a new buffer of exactly its encoded size.
    pub(crate) fn encode(&self, request: &ExportTraceServiceRequest) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.total);
        let mut next = self.lens.iter().copied();
        for rs in &request.resource_spans {
            write_resource_spans(rs, &mut next, &mut out);
        }
        debug_assert_eq!(out.len(), self.total, "lengths of another request");
        out
    }
}

/// The spans of one `ScopeSpans`, measured one by one as they arrive (the
/// batcher's size accounting): each span's nested lengths in pre-order, for
/// [`Lengths::with_spans`].
#[derive(Debug, Default)]
pub(crate) struct MeasuredSpans {
    lens: Vec<usize>,
    /// Encoded size of the spans as the scope's repeated field.
    len: usize,
}

impl MeasuredSpans {
    /// Measures `span`, the next of these spans; returns its encoded size
    /// in the scope (field key, length and body).
    pub(crate) fn push(&mut self, span: &Span) -> usize {
        let size = nested(2, measure_span(span, &mut self.lens));
        self.len += size;
        size
    }

    /// Takes the last span pushed (of encoded size `size`, pushed when
    /// `self` held `at` lengths) out into a measure of its own.
    pub(crate) fn split_last(&mut self, at: usize, size: usize) -> MeasuredSpans {
        self.len -= size;
        MeasuredSpans {
            lens: self.lens.split_off(at),
            len: size,
        }
    }

    /// Number of lengths held (see [`MeasuredSpans::split_last`]).
    pub(crate) fn mark(&self) -> usize {
        self.lens.len()
    }

    /// Appends `other`'s spans after these.
    pub(crate) fn append(&mut self, other: MeasuredSpans) {
        if self.lens.is_empty() {
            *self = other;
        } else {
            self.lens.extend_from_slice(&other.lens);
            self.len += other.len;
        }
    }
}

type Next<'a> = std::iter::Copied<std::slice::Iter<'a, usize>>;

/// Size of a length-delimited field of `len` bytes.
fn nested(tag: u32, len: usize) -> usize {
    key_len(tag) + prost::length_delimiter_len(len) + len
}

fn key_len(tag: u32) -> usize {
    prost::length_delimiter_len((tag as usize) << 3)
}

fn put_varint(mut value: u64, buf: &mut impl BufMut) {
    while value >= 0x80 {
        buf.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

fn varint_len(value: u64) -> usize {
    // ((bits - 1) / 7) + 1 bytes, with 0 taking one byte.
    ((64 - (value | 1).leading_zeros() as usize) * 9 + 64) / 64
}

fn put_key(tag: u32, wire: u32, buf: &mut impl BufMut) {
    put_varint(u64::from((tag << 3) | wire), buf);
}

fn put_len(tag: u32, len: usize, buf: &mut impl BufMut) {
    put_key(tag, LEN, buf);
    put_varint(len as u64, buf);
}

fn bytes_len(tag: u32, value: &[u8]) -> usize {
    if value.is_empty() {
        0
    } else {
        nested(tag, value.len())
    }
}

fn put_bytes(tag: u32, value: &[u8], buf: &mut impl BufMut) {
    if !value.is_empty() {
        put_len(tag, value.len(), buf);
        buf.put_slice(value);
    }
}

fn uint_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + varint_len(value)
    }
}

fn put_uint(tag: u32, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        put_key(tag, VARINT, buf);
        put_varint(value, buf);
    }
}

/// An `int32` field: negative values are sign-extended to ten bytes.
fn int32_len(tag: u32, value: i32) -> usize {
    uint_len(tag, i64::from(value) as u64)
}

fn put_int32(tag: u32, value: i32, buf: &mut impl BufMut) {
    put_uint(tag, i64::from(value) as u64, buf);
}

fn fixed64_len(tag: u32, value: u64) -> usize {
    if value == 0 { 0 } else { key_len(tag) + 8 }
}

fn put_fixed64(tag: u32, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        put_key(tag, FIXED64, buf);
        buf.put_u64_le(value);
    }
}

fn fixed32_len(tag: u32, value: u32) -> usize {
    if value == 0 { 0 } else { key_len(tag) + 4 }
}

fn put_fixed32(tag: u32, value: u32, buf: &mut impl BufMut) {
    if value != 0 {
        put_key(tag, FIXED32, buf);
        buf.put_u32_le(value);
    }
}

/// A message field written by prost itself: `Status`, a leaf message that
/// is mostly absent.
fn message_len(tag: u32, message: &impl Message) -> usize {
    nested(tag, message.encoded_len())
}

fn put_message(tag: u32, message: &impl Message, buf: &mut impl BufMut) {
    put_len(tag, message.encoded_len(), buf);
    message.encode_raw(buf);
}

/// Encoded length of a `Resource`'s body.
pub(crate) fn resource_len(resource: &Resource) -> usize {
    attributes_len(1, &resource.attributes)
        + uint_len(2, u64::from(resource.dropped_attributes_count))
}

fn put_resource(resource: &Resource, buf: &mut impl BufMut) {
    put_len(1, resource_len(resource), buf);
    put_attributes(1, &resource.attributes, buf);
    put_uint(2, u64::from(resource.dropped_attributes_count), buf);
}

/// Encoded length of an `InstrumentationScope`'s body.
pub(crate) fn scope_len(scope: &InstrumentationScope) -> usize {
    bytes_len(1, scope.name.as_bytes())
        + bytes_len(2, scope.version.as_bytes())
        + attributes_len(3, &scope.attributes)
        + uint_len(4, u64::from(scope.dropped_attributes_count))
}

fn put_scope(scope: &InstrumentationScope, buf: &mut impl BufMut) {
    put_len(1, scope_len(scope), buf);
    put_bytes(1, scope.name.as_bytes(), buf);
    put_bytes(2, scope.version.as_bytes(), buf);
    put_attributes(3, &scope.attributes, buf);
    put_uint(4, u64::from(scope.dropped_attributes_count), buf);
}

/// Repeated attributes, measured where written: a `KeyValue` nests one
/// `AnyValue`, whose string and scalar values are measured and written in
/// one step each.
fn attributes_len(tag: u32, attributes: &[KeyValue]) -> usize {
    attributes
        .iter()
        .map(|kv| nested(tag, key_value_len(kv, kv.value.as_ref().map(any_value_len))))
        .sum()
}

fn put_attributes(tag: u32, attributes: &[KeyValue], buf: &mut impl BufMut) {
    for kv in attributes {
        put_key_value(tag, kv, kv.value.as_ref().map(any_value_len), buf);
    }
}

/// One attribute, given its value's length. Inlined into both loops: a call
/// per attribute shows in the criterion bench `otlp_encode/metadata`.
#[inline(always)]
fn put_key_value(tag: u32, kv: &KeyValue, value_len: Option<usize>, buf: &mut impl BufMut) {
    put_len(tag, key_value_len(kv, value_len), buf);
    put_bytes(1, kv.key.as_bytes(), buf);
    if let (Some(value), Some(len)) = (&kv.value, value_len) {
        put_len(2, len, buf);
        put_any_value(value, buf);
    }
}

/// A span's attributes, measured in the first pass: each value's length is
/// recorded (`usize::MAX` for none) so that the second pass
/// ([`write_attributes`]) does not measure it again.
fn measure_attributes(tag: u32, attributes: &[KeyValue], lens: &mut Vec<usize>) -> usize {
    attributes
        .iter()
        .map(|kv| {
            let value_len = kv.value.as_ref().map(any_value_len);
            lens.push(value_len.unwrap_or(usize::MAX));
            nested(tag, key_value_len(kv, value_len))
        })
        .sum()
}

fn write_attributes(tag: u32, attributes: &[KeyValue], next: &mut Next<'_>, buf: &mut impl BufMut) {
    for kv in attributes {
        let value_len = next.next().filter(|&len| len != usize::MAX);
        put_key_value(tag, kv, value_len, buf);
    }
}

/// A `KeyValue`'s length, given its value's (fields in tag order: key,
/// value).
fn key_value_len(kv: &KeyValue, value_len: Option<usize>) -> usize {
    bytes_len(1, kv.key.as_bytes()) + value_len.map_or(0, |len| nested(2, len))
}

/// An `AnyValue`'s length. Its `value` is a oneof: a set variant is written
/// even when it holds its type's default (`""`, `0`, `false`, an empty
/// array). Arrays and lists, rare in spans, are measured again by each
/// enclosing value.
fn any_value_len(value: &AnyValue) -> usize {
    match &value.value {
        None => 0,
        Some(Value::StringValue(s)) => nested(1, s.len()),
        Some(Value::BoolValue(_)) => key_len(2) + 1,
        Some(Value::IntValue(i)) => key_len(3) + varint_len(*i as u64),
        Some(Value::DoubleValue(_)) => key_len(4) + 8,
        Some(Value::ArrayValue(a)) => nested(5, array_len(a)),
        Some(Value::KvlistValue(l)) => nested(6, attributes_len(1, &l.values)),
        Some(Value::BytesValue(b)) => nested(7, b.len()),
    }
}

fn array_len(array: &ArrayValue) -> usize {
    array
        .values
        .iter()
        .map(|v| nested(1, any_value_len(v)))
        .sum()
}

fn put_any_value(value: &AnyValue, buf: &mut impl BufMut) {
    match &value.value {
        None => {}
        Some(Value::StringValue(s)) => {
            put_len(1, s.len(), buf);
            buf.put_slice(s.as_bytes());
        }
        Some(Value::BoolValue(b)) => {
            put_key(2, VARINT, buf);
            buf.put_u8(u8::from(*b));
        }
        Some(Value::IntValue(i)) => {
            put_key(3, VARINT, buf);
            put_varint(*i as u64, buf);
        }
        Some(Value::DoubleValue(d)) => {
            put_key(4, FIXED64, buf);
            buf.put_f64_le(*d);
        }
        Some(Value::ArrayValue(a)) => {
            put_len(5, array_len(a), buf);
            for v in &a.values {
                put_len(1, any_value_len(v), buf);
                put_any_value(v, buf);
            }
        }
        Some(Value::KvlistValue(l)) => {
            put_len(6, attributes_len(1, &l.values), buf);
            put_attributes(1, &l.values, buf);
        }
        Some(Value::BytesValue(b)) => {
            put_len(7, b.len(), buf);
            buf.put_slice(b);
        }
    }
}

/// Records a slot for a message's length before its children's, measures
/// with `measure` and fills the slot.
fn slot(lens: &mut Vec<usize>, measure: impl FnOnce(&mut Vec<usize>) -> usize) -> usize {
    let at = lens.len();
    lens.push(0);
    let len = measure(lens);
    lens[at] = len;
    len
}

// `ResourceSpans` and `ScopeSpans` share one layout (an optional leaf
// message at tag 1, repeated children at tag 2, `schema_url` at tag 3) but
// keep a pair of functions each: one generic pair over both is slower on
// the criterion bench `otlp_encode/metadata`.
fn measure_resource_spans(rs: &ResourceSpans, lens: &mut Vec<usize>) -> usize {
    slot(lens, |lens| {
        rs.resource
            .as_ref()
            .map_or(0, |r| nested(1, resource_len(r)))
            + rs.scope_spans
                .iter()
                .map(|ss| nested(2, measure_scope_spans(ss, lens)))
                .sum::<usize>()
            + bytes_len(3, rs.schema_url.as_bytes())
    })
}

fn write_resource_spans(rs: &ResourceSpans, next: &mut Next<'_>, buf: &mut impl BufMut) {
    put_len(1, next.next().unwrap_or(0), buf);
    if let Some(resource) = &rs.resource {
        put_resource(resource, buf);
    }
    for ss in &rs.scope_spans {
        write_scope_spans(ss, next, buf);
    }
    put_bytes(3, rs.schema_url.as_bytes(), buf);
}

fn measure_scope_spans(ss: &ScopeSpans, lens: &mut Vec<usize>) -> usize {
    slot(lens, |lens| {
        ss.scope.as_ref().map_or(0, |s| nested(1, scope_len(s)))
            + ss.spans
                .iter()
                .map(|span| nested(2, measure_span(span, lens)))
                .sum::<usize>()
            + bytes_len(3, ss.schema_url.as_bytes())
    })
}

fn write_scope_spans(ss: &ScopeSpans, next: &mut Next<'_>, buf: &mut impl BufMut) {
    put_len(2, next.next().unwrap_or(0), buf);
    if let Some(scope) = &ss.scope {
        put_scope(scope, buf);
    }
    for span in &ss.spans {
        write_span(span, next, buf);
    }
    put_bytes(3, ss.schema_url.as_bytes(), buf);
}

fn measure_span(span: &Span, lens: &mut Vec<usize>) -> usize {
    slot(lens, |lens| {
        bytes_len(1, &span.trace_id)
            + bytes_len(2, &span.span_id)
            + bytes_len(3, span.trace_state.as_bytes())
            + bytes_len(4, &span.parent_span_id)
            + bytes_len(5, span.name.as_bytes())
            + int32_len(6, span.kind)
            + fixed64_len(7, span.start_time_unix_nano)
            + fixed64_len(8, span.end_time_unix_nano)
            + measure_span_attributes(span, lens)
            + uint_len(10, u64::from(span.dropped_attributes_count))
            + span
                .events
                .iter()
                .map(|e| nested(11, measure_event(e, lens)))
                .sum::<usize>()
            + uint_len(12, u64::from(span.dropped_events_count))
            + span
                .links
                .iter()
                .map(|l| nested(13, measure_link(l, lens)))
                .sum::<usize>()
            + uint_len(14, u64::from(span.dropped_links_count))
            + span.status.as_ref().map_or(0, |s| message_len(15, s))
            + fixed32_len(16, span.flags)
    })
}

/// A span's attributes, measured: the turn's shared block, while it leads
/// them, as its bytes encoded once for all the turn's spans, then the
/// span's own; all of them as its own when the block no longer leads them
/// (a stage rewrote one). How many attributes the block stands for is
/// recorded, for [`write_span_attributes`].
fn measure_span_attributes(span: &Span, lens: &mut Vec<usize>) -> usize {
    let lead = if span.shared.leads(&span.attributes) {
        span.shared.len()
    } else {
        0
    };
    lens.push(lead);
    shared_bytes(span, lead).len()
        + measure_attributes(9, span.attributes.get(lead..).unwrap_or_default(), lens)
}

fn write_span_attributes(span: &Span, next: &mut Next<'_>, buf: &mut impl BufMut) {
    let lead = next.next().unwrap_or(0);
    buf.put_slice(shared_bytes(span, lead));
    write_attributes(
        9,
        span.attributes.get(lead..).unwrap_or_default(),
        next,
        buf,
    );
}

/// The bytes of the span's shared block when it stands for `lead` > 0
/// attributes.
fn shared_bytes(span: &Span, lead: usize) -> &[u8] {
    if lead == 0 {
        return &[];
    }
    span.shared.encoded(&span.attributes, |attributes| {
        let mut out = Vec::with_capacity(attributes_len(9, attributes));
        put_attributes(9, attributes, &mut out);
        out
    })
}

/// Written in tag order, as prost does (`flags`, tag 16, comes last).
fn write_span(span: &Span, next: &mut Next<'_>, buf: &mut impl BufMut) {
    put_len(2, next.next().unwrap_or(0), buf);
    put_bytes(1, &span.trace_id, buf);
    put_bytes(2, &span.span_id, buf);
    put_bytes(3, span.trace_state.as_bytes(), buf);
    put_bytes(4, &span.parent_span_id, buf);
    put_bytes(5, span.name.as_bytes(), buf);
    put_int32(6, span.kind, buf);
    put_fixed64(7, span.start_time_unix_nano, buf);
    put_fixed64(8, span.end_time_unix_nano, buf);
    write_span_attributes(span, next, buf);
    put_uint(10, u64::from(span.dropped_attributes_count), buf);
    for event in &span.events {
        write_event(event, next, buf);
    }
    put_uint(12, u64::from(span.dropped_events_count), buf);
    for link in &span.links {
        write_link(link, next, buf);
    }
    put_uint(14, u64::from(span.dropped_links_count), buf);
    if let Some(status) = &span.status {
        put_message(15, status, buf);
    }
    put_fixed32(16, span.flags, buf);
}

fn measure_event(event: &span::Event, lens: &mut Vec<usize>) -> usize {
    slot(lens, |_| {
        fixed64_len(1, event.time_unix_nano)
            + bytes_len(2, event.name.as_bytes())
            + attributes_len(3, &event.attributes)
            + uint_len(4, u64::from(event.dropped_attributes_count))
    })
}

fn write_event(event: &span::Event, next: &mut Next<'_>, buf: &mut impl BufMut) {
    put_len(11, next.next().unwrap_or(0), buf);
    put_fixed64(1, event.time_unix_nano, buf);
    put_bytes(2, event.name.as_bytes(), buf);
    put_attributes(3, &event.attributes, buf);
    put_uint(4, u64::from(event.dropped_attributes_count), buf);
}

fn measure_link(link: &span::Link, lens: &mut Vec<usize>) -> usize {
    slot(lens, |_| {
        bytes_len(1, &link.trace_id)
            + bytes_len(2, &link.span_id)
            + bytes_len(3, link.trace_state.as_bytes())
            + attributes_len(4, &link.attributes)
            + uint_len(5, u64::from(link.dropped_attributes_count))
            + fixed32_len(6, link.flags)
    })
}

fn write_link(link: &span::Link, next: &mut Next<'_>, buf: &mut impl BufMut) {
    put_len(13, next.next().unwrap_or(0), buf);
    put_bytes(1, &link.trace_id, buf);
    put_bytes(2, &link.span_id, buf);
    put_bytes(3, link.trace_state.as_bytes(), buf);
    put_attributes(4, &link.attributes, buf);
    put_uint(5, u64::from(link.dropped_attributes_count), buf);
    put_fixed32(6, link.flags, buf);
}

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) mod generated;
