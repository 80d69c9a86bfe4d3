//! Requests built in prost's messages, encoded by prost and, converted
//! to the span model, by this module.
use super::{Lengths, encode_request, varint_len};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValueList, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Status;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use prost::Message;

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn same_as_prost(request: &ExportTraceServiceRequest) {
    let model = hermes_span::collector::trace::v1::ExportTraceServiceRequest::from(request.clone());
    let ours = encode_request(&model);
    assert_eq!(ours, request.encode_to_vec());
    assert_eq!(ours.len(), Lengths::of(&model).total);
    assert_eq!(ours.capacity(), ours.len(), "sized exactly");
}

#[test]
fn varint_len_matches_prost() {
    for shift in 0..64 {
        for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
            assert_eq!(varint_len(v), prost::encoding::encoded_len_varint(v), "{v}");
        }
    }
    assert_eq!(varint_len(0), 1);
    assert_eq!(varint_len(u64::MAX), 10);
}

#[test]
fn empty_and_default_messages_match_prost() {
    same_as_prost(&ExportTraceServiceRequest::default());
    same_as_prost(&ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource::default()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope::default()),
                spans: vec![Span::default(), Span::default()],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    });
    same_as_prost(&ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans::default(); 3],
    });
}

#[test]
fn every_field_and_value_kind_matches_prost() {
    let attributes = vec![
        kv("s", Value::StringValue("text ✓".into())),
        kv("empty", Value::StringValue(String::new())),
        kv("b", Value::BoolValue(false)),
        kv("i", Value::IntValue(-3)),
        kv("zero", Value::IntValue(0)),
        kv("d", Value::DoubleValue(0.25)),
        kv("bytes", Value::BytesValue(vec![0, 1, 2])),
        kv(
            "array",
            Value::ArrayValue(ArrayValue {
                values: vec![
                    AnyValue {
                        value: Some(Value::StringValue("a".into())),
                    },
                    AnyValue::default(),
                ],
            }),
        ),
        kv(
            "kvlist",
            Value::KvlistValue(KeyValueList {
                values: vec![kv("inner", Value::IntValue(i64::MIN))],
            }),
        ),
        KeyValue {
            key: "no value".into(),
            value: None,
            key_strindex: 0,
        },
    ];
    let long = "x".repeat(300);
    let span = Span {
        trace_id: vec![7; 16],
        span_id: vec![9; 8],
        trace_state: "k=v".into(),
        parent_span_id: vec![1; 8],
        flags: 0x301,
        name: long.clone(),
        kind: span::SpanKind::Client as i32,
        start_time_unix_nano: 1,
        end_time_unix_nano: u64::MAX,
        attributes: attributes.clone(),
        dropped_attributes_count: 300,
        events: vec![
            span::Event {
                time_unix_nano: 5,
                name: "gen_ai.choice".into(),
                attributes: attributes.clone(),
                dropped_attributes_count: 1,
            },
            span::Event::default(),
        ],
        dropped_events_count: 2,
        links: vec![
            span::Link {
                trace_id: vec![3; 16],
                span_id: vec![4; 8],
                trace_state: "a=b".into(),
                attributes: attributes.clone(),
                dropped_attributes_count: 3,
                flags: 1,
            },
            span::Link::default(),
        ],
        dropped_links_count: 4,
        status: Some(Status {
            message: long,
            code: 2,
        }),
    };
    let negative_kind = Span {
        kind: -1,
        ..Span::default()
    };
    same_as_prost(&ExportTraceServiceRequest {
        resource_spans: vec![
            ResourceSpans {
                resource: Some(Resource {
                    attributes: attributes.clone(),
                    dropped_attributes_count: 2,
                    entity_refs: Vec::new(),
                }),
                scope_spans: vec![
                    ScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: "hermes".into(),
                            version: "1".into(),
                            attributes,
                            dropped_attributes_count: 0,
                        }),
                        spans: vec![span.clone(), negative_kind, span.clone()],
                        schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
                    },
                    ScopeSpans::default(),
                ],
                schema_url: "r".into(),
            },
            ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![span],
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
    });
}

#[test]
fn messages_longer_than_a_one_byte_length_match_prost() {
    // Lengths of 127, 128 and 16 384 bytes switch the varint width.
    for n in [100, 127, 128, 200, 16_384, 70_000] {
        let span = Span {
            name: "n".repeat(n),
            ..Span::default()
        };
        same_as_prost(&ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![span; 3],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        });
    }
}

/// Spans whose leading attributes are their turn's shared block encode as
/// if they were their own: the block's bytes are made once and copied, and
/// a span whose leading attribute a stage rewrote is encoded attribute by
/// attribute.
#[test]
fn a_turns_shared_attributes_encode_as_each_spans_own() {
    use hermes_span::common::v1 as ours;
    use hermes_span::{SharedAttributes, Str};

    let shared = |key: &'static str, value: &str| ours::KeyValue {
        key: Str::from_static(key),
        value: Some(ours::AnyValue {
            value: Some(ours::any_value::Value::StringValue(Str::from(value))),
        }),
    };
    let lead = [
        shared("session.id", "sess-1"),
        shared("hermes.turn_id", "turn-1"),
    ];
    let block = SharedAttributes::new(&lead);
    let theirs_lead = || {
        vec![
            kv("session.id", s("sess-1")),
            kv("hermes.turn_id", s("turn-1")),
        ]
    };
    let mut theirs = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: (0..3u8)
                    .map(|n| Span {
                        span_id: vec![n + 1; 8],
                        attributes: [theirs_lead(), vec![kv("n", Value::IntValue(n.into()))]]
                            .concat(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut model =
        hermes_span::collector::trace::v1::ExportTraceServiceRequest::from(theirs.clone());
    let spans = &mut model.resource_spans[0].scope_spans[0].spans;
    for span in spans.iter_mut() {
        span.attributes.splice(..2, lead.iter().cloned());
        span.shared = block.clone();
    }
    // A stage rewrote the second attribute of the last span: a new string.
    spans[2].attributes[1] = shared("hermes.turn_id", "<redacted>");
    theirs.resource_spans[0].scope_spans[0].spans[2].attributes[1] =
        kv("hermes.turn_id", s("<redacted>"));
    assert!(block.leads(&spans[0].attributes) && !block.leads(&spans[2].attributes));
    for _ in 0..2 {
        let ours = encode_request(&model);
        assert_eq!(ours, theirs.encode_to_vec());
        assert_eq!(ours.len(), Lengths::of(&model).total);
    }
}

fn s(text: &str) -> Value {
    Value::StringValue(text.to_owned())
}
