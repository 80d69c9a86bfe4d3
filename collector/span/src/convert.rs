//! Conversions between this model and `opentelemetry_proto`'s messages, both
//! ways: `From<&ours> for theirs` (the JSON file exporter, which serializes
//! prost's messages as OTLP JSON, and tests that compare against them) and
//! `From<theirs> for ours` (tests and benches that build prost's messages).
//! A round trip from ours is the identity (but for `Span::shared`, a cache
//! that compares equal whatever it holds, dropped); one from theirs drops
//! `KeyValue::key_strindex`, `Resource::entity_refs` and the
//! `string_value_strindex` value (all three for OTLP's profiles and entities),
//! which the model leaves out.

use opentelemetry_proto::tonic as otlp;

use crate::collector::trace::v1::ExportTraceServiceRequest;
use crate::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value,
};
use crate::resource::v1::Resource;
use crate::trace::v1::{ResourceSpans, ScopeSpans, Span, span};

type OtlpValue = otlp::common::v1::any_value::Value;

fn list<'a, A: 'a, B: From<&'a A>>(items: &'a [A]) -> Vec<B> {
    items.iter().map(B::from).collect()
}

fn owned<A, B: From<A>>(items: Vec<A>) -> Vec<B> {
    items.into_iter().map(B::from).collect()
}

impl From<&AnyValue> for otlp::common::v1::AnyValue {
    fn from(v: &AnyValue) -> Self {
        Self {
            value: v.value.as_ref().map(|value| match value {
                Value::StringValue(s) => OtlpValue::StringValue(s.into()),
                Value::BoolValue(b) => OtlpValue::BoolValue(*b),
                Value::IntValue(i) => OtlpValue::IntValue(*i),
                Value::DoubleValue(d) => OtlpValue::DoubleValue(*d),
                Value::ArrayValue(a) => OtlpValue::ArrayValue(otlp::common::v1::ArrayValue {
                    values: list(&a.values),
                }),
                Value::KvlistValue(l) => OtlpValue::KvlistValue(otlp::common::v1::KeyValueList {
                    values: list(&l.values),
                }),
                Value::BytesValue(b) => OtlpValue::BytesValue(b.clone()),
            }),
        }
    }
}

impl From<otlp::common::v1::AnyValue> for AnyValue {
    fn from(v: otlp::common::v1::AnyValue) -> Self {
        Self {
            value: v.value.and_then(|value| {
                Some(match value {
                    OtlpValue::StringValue(s) => Value::StringValue(s.into()),
                    OtlpValue::BoolValue(b) => Value::BoolValue(b),
                    OtlpValue::IntValue(i) => Value::IntValue(i),
                    OtlpValue::DoubleValue(d) => Value::DoubleValue(d),
                    OtlpValue::ArrayValue(a) => Value::ArrayValue(ArrayValue {
                        values: owned(a.values),
                    }),
                    OtlpValue::KvlistValue(l) => Value::KvlistValue(KeyValueList {
                        values: owned(l.values),
                    }),
                    OtlpValue::BytesValue(b) => Value::BytesValue(b),
                    // A profiles-only reference into a dictionary traces do
                    // not have: absent, as OTLP says to read it.
                    OtlpValue::StringValueStrindex(_) => return None,
                })
            }),
        }
    }
}

impl From<&KeyValue> for otlp::common::v1::KeyValue {
    fn from(kv: &KeyValue) -> Self {
        Self {
            key: (&kv.key).into(),
            value: kv.value.as_ref().map(Into::into),
            key_strindex: 0,
        }
    }
}

impl From<otlp::common::v1::KeyValue> for KeyValue {
    fn from(kv: otlp::common::v1::KeyValue) -> Self {
        Self {
            key: kv.key.into(),
            value: kv.value.map(Into::into),
        }
    }
}

impl From<&InstrumentationScope> for otlp::common::v1::InstrumentationScope {
    fn from(s: &InstrumentationScope) -> Self {
        Self {
            name: (&s.name).into(),
            version: (&s.version).into(),
            attributes: list(&s.attributes),
            dropped_attributes_count: s.dropped_attributes_count,
        }
    }
}

impl From<otlp::common::v1::InstrumentationScope> for InstrumentationScope {
    fn from(s: otlp::common::v1::InstrumentationScope) -> Self {
        Self {
            name: s.name.into(),
            version: s.version.into(),
            attributes: owned(s.attributes),
            dropped_attributes_count: s.dropped_attributes_count,
        }
    }
}

impl From<&Resource> for otlp::resource::v1::Resource {
    fn from(r: &Resource) -> Self {
        Self {
            attributes: list(&r.attributes),
            dropped_attributes_count: r.dropped_attributes_count,
            entity_refs: Vec::new(),
        }
    }
}

impl From<otlp::resource::v1::Resource> for Resource {
    fn from(r: otlp::resource::v1::Resource) -> Self {
        Self {
            attributes: owned(r.attributes),
            dropped_attributes_count: r.dropped_attributes_count,
        }
    }
}

impl From<&span::Event> for otlp::trace::v1::span::Event {
    fn from(e: &span::Event) -> Self {
        Self {
            time_unix_nano: e.time_unix_nano,
            name: (&e.name).into(),
            attributes: list(&e.attributes),
            dropped_attributes_count: e.dropped_attributes_count,
        }
    }
}

impl From<otlp::trace::v1::span::Event> for span::Event {
    fn from(e: otlp::trace::v1::span::Event) -> Self {
        Self {
            time_unix_nano: e.time_unix_nano,
            name: e.name.into(),
            attributes: owned(e.attributes),
            dropped_attributes_count: e.dropped_attributes_count,
        }
    }
}

impl From<&span::Link> for otlp::trace::v1::span::Link {
    fn from(l: &span::Link) -> Self {
        Self {
            trace_id: l.trace_id.to_vec(),
            span_id: l.span_id.to_vec(),
            trace_state: l.trace_state.clone(),
            attributes: list(&l.attributes),
            dropped_attributes_count: l.dropped_attributes_count,
            flags: l.flags,
        }
    }
}

impl From<otlp::trace::v1::span::Link> for span::Link {
    fn from(l: otlp::trace::v1::span::Link) -> Self {
        Self {
            trace_id: l.trace_id.into(),
            span_id: l.span_id.into(),
            trace_state: l.trace_state,
            attributes: owned(l.attributes),
            dropped_attributes_count: l.dropped_attributes_count,
            flags: l.flags,
        }
    }
}

impl From<&Span> for otlp::trace::v1::Span {
    fn from(s: &Span) -> Self {
        Self {
            trace_id: s.trace_id.to_vec(),
            span_id: s.span_id.to_vec(),
            trace_state: s.trace_state.clone(),
            parent_span_id: s.parent_span_id.to_vec(),
            flags: s.flags,
            name: (&s.name).into(),
            kind: s.kind,
            start_time_unix_nano: s.start_time_unix_nano,
            end_time_unix_nano: s.end_time_unix_nano,
            attributes: list(&s.attributes),
            dropped_attributes_count: s.dropped_attributes_count,
            events: list(&s.events),
            dropped_events_count: s.dropped_events_count,
            links: list(&s.links),
            dropped_links_count: s.dropped_links_count,
            status: s.status.clone(),
        }
    }
}

impl From<otlp::trace::v1::Span> for Span {
    fn from(s: otlp::trace::v1::Span) -> Self {
        Self {
            trace_id: s.trace_id.into(),
            span_id: s.span_id.into(),
            trace_state: s.trace_state,
            parent_span_id: s.parent_span_id.into(),
            flags: s.flags,
            name: s.name.into(),
            kind: s.kind,
            start_time_unix_nano: s.start_time_unix_nano,
            end_time_unix_nano: s.end_time_unix_nano,
            attributes: owned(s.attributes),
            dropped_attributes_count: s.dropped_attributes_count,
            events: owned(s.events),
            dropped_events_count: s.dropped_events_count,
            links: owned(s.links),
            dropped_links_count: s.dropped_links_count,
            status: s.status,
            shared: Default::default(),
        }
    }
}

impl From<&ScopeSpans> for otlp::trace::v1::ScopeSpans {
    fn from(s: &ScopeSpans) -> Self {
        Self {
            scope: s.scope.as_ref().map(Into::into),
            spans: list(&s.spans),
            schema_url: s.schema_url.clone(),
        }
    }
}

impl From<otlp::trace::v1::ScopeSpans> for ScopeSpans {
    fn from(s: otlp::trace::v1::ScopeSpans) -> Self {
        Self {
            scope: s.scope.map(Into::into),
            spans: owned(s.spans),
            schema_url: s.schema_url,
        }
    }
}

impl From<&ResourceSpans> for otlp::trace::v1::ResourceSpans {
    fn from(r: &ResourceSpans) -> Self {
        Self {
            resource: r.resource.as_ref().map(Into::into),
            scope_spans: list(&r.scope_spans),
            schema_url: r.schema_url.clone(),
        }
    }
}

impl From<otlp::trace::v1::ResourceSpans> for ResourceSpans {
    fn from(r: otlp::trace::v1::ResourceSpans) -> Self {
        Self {
            resource: r.resource.map(Into::into),
            scope_spans: owned(r.scope_spans),
            schema_url: r.schema_url,
        }
    }
}

impl From<&ExportTraceServiceRequest> for otlp::collector::trace::v1::ExportTraceServiceRequest {
    fn from(r: &ExportTraceServiceRequest) -> Self {
        Self {
            resource_spans: list(&r.resource_spans),
        }
    }
}

impl From<otlp::collector::trace::v1::ExportTraceServiceRequest> for ExportTraceServiceRequest {
    fn from(r: otlp::collector::trace::v1::ExportTraceServiceRequest) -> Self {
        Self {
            resource_spans: owned(r.resource_spans),
        }
    }
}

/// prost's messages for a batch of ours.
pub fn to_otlp(batch: &[ResourceSpans]) -> Vec<otlp::trace::v1::ResourceSpans> {
    list(batch)
}

/// Ours for a batch of prost's messages.
pub fn from_otlp(batch: Vec<otlp::trace::v1::ResourceSpans>) -> Vec<ResourceSpans> {
    owned(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::v1::Status;
    use crate::{SharedAttributes, Str};

    fn kv(key: &'static str, value: Value) -> KeyValue {
        KeyValue {
            key: Str::from_static(key),
            value: Some(AnyValue { value: Some(value) }),
        }
    }

    #[test]
    fn round_trip_through_prost_is_the_identity() {
        let attributes = vec![
            kv("s", Value::StringValue("text ✓".into())),
            kv("b", Value::BoolValue(true)),
            kv("i", Value::IntValue(-3)),
            kv("d", Value::DoubleValue(0.5)),
            kv("bytes", Value::BytesValue(vec![1, 2])),
            kv(
                "array",
                Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue::default()],
                }),
            ),
            kv(
                "kvlist",
                Value::KvlistValue(KeyValueList {
                    values: vec![kv("inner", Value::IntValue(1))],
                }),
            ),
            KeyValue {
                key: "no value".into(),
                value: None,
            },
        ];
        let span = Span {
            trace_id: [1; 16].into(),
            span_id: [2; 8].into(),
            trace_state: "k=v".into(),
            parent_span_id: [3; 8].into(),
            flags: 1,
            name: Str::from_static("chat"),
            kind: 3,
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            attributes: attributes.clone(),
            dropped_attributes_count: 1,
            events: vec![span::Event {
                time_unix_nano: 3,
                name: "e".into(),
                attributes: attributes.clone(),
                dropped_attributes_count: 2,
            }],
            dropped_events_count: 3,
            links: vec![span::Link {
                trace_id: [4; 16].into(),
                span_id: [5; 8].into(),
                trace_state: String::new(),
                attributes: attributes.clone(),
                dropped_attributes_count: 4,
                flags: 5,
            }],
            dropped_links_count: 6,
            status: Some(Status {
                message: "m".into(),
                code: 2,
            }),
            shared: SharedAttributes::new(&attributes[..1]),
        };
        let batch = vec![ResourceSpans {
            resource: Some(Resource {
                attributes: attributes.clone(),
                dropped_attributes_count: 7,
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "hermes".into(),
                    version: "1".into(),
                    attributes,
                    dropped_attributes_count: 8,
                }),
                spans: vec![span],
                schema_url: "s".into(),
            }],
            schema_url: "r".into(),
        }];
        assert_eq!(from_otlp(to_otlp(&batch)), batch);
        let request = ExportTraceServiceRequest {
            resource_spans: batch,
        };
        let theirs = otlp::collector::trace::v1::ExportTraceServiceRequest::from(&request);
        assert_eq!(ExportTraceServiceRequest::from(theirs), request);
    }
}
