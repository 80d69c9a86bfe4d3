//! Random requests: every field, nesting and length width, against prost
//! (built in prost's messages, converted to the span model).
use super::{Lengths, MeasuredSpans, encode_request};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValueList, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Status;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use prost::Message;

fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = prop_oneof![
        ".{0,40}".prop_map(Value::StringValue),
        any::<bool>().prop_map(Value::BoolValue),
        any::<i64>().prop_map(Value::IntValue),
        any::<f64>().prop_map(Value::DoubleValue),
        vec(any::<u8>(), 0..20).prop_map(Value::BytesValue),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        let any = option::of(inner).prop_map(|value| AnyValue { value });
        prop_oneof![
            vec(any.clone(), 0..4).prop_map(|values| Value::ArrayValue(ArrayValue { values })),
            vec(("[a-z]{0,5}", any), 0..4).prop_map(|entries| {
                Value::KvlistValue(KeyValueList {
                    values: entries
                        .into_iter()
                        .map(|(key, value)| KeyValue {
                            key,
                            value: Some(value),
                            key_strindex: 0,
                        })
                        .collect(),
                })
            }),
        ]
    });
    option::of(value).prop_map(|value| AnyValue { value })
}

fn attributes() -> impl Strategy<Value = Vec<KeyValue>> {
    vec(
        // `key_strindex` (profiles only) is not in the span model.
        ("[a-z._]{0,12}", option::of(any_value())).prop_map(|(key, value)| KeyValue {
            key,
            value,
            key_strindex: 0,
        }),
        0..6,
    )
}

fn id(len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(Vec::new()), vec(any::<u8>(), len)]
}

fn span() -> impl Strategy<Value = Span> {
    let event = (any::<u64>(), ".{0,10}", attributes(), 0u32..3).prop_map(
        |(time_unix_nano, name, attributes, dropped_attributes_count)| span::Event {
            time_unix_nano,
            name,
            attributes,
            dropped_attributes_count,
        },
    );
    let link = (id(16), id(8), ".{0,5}", attributes(), 0u32..3, any::<u32>()).prop_map(
        |(trace_id, span_id, trace_state, attributes, dropped_attributes_count, flags)| {
            span::Link {
                trace_id,
                span_id,
                trace_state,
                attributes,
                dropped_attributes_count,
                flags,
            }
        },
    );
    let ids = (
        id(16),
        id(8),
        ".{0,5}",
        id(8),
        any::<u32>(),
        ".{0,200}",
        -1i32..6,
    );
    let times = (any::<u64>(), prop_oneof![Just(0u64), any::<u64>()]);
    let children = (
        attributes(),
        vec(event, 0..3),
        vec(link, 0..2),
        (0u32..300, 0u32..2, 0u32..2),
        option::of((".{0,20}", 0i32..3).prop_map(|(message, code)| Status { message, code })),
    );
    (ids, times, children).prop_map(
        |(
            (trace_id, span_id, trace_state, parent_span_id, flags, name, kind),
            (start_time_unix_nano, end_time_unix_nano),
            (attributes, events, links, dropped, status),
        )| Span {
            trace_id,
            span_id,
            trace_state,
            parent_span_id,
            flags,
            name,
            kind,
            start_time_unix_nano,
            end_time_unix_nano,
            attributes,
            dropped_attributes_count: dropped.0,
            events,
            dropped_events_count: dropped.1,
            links,
            dropped_links_count: dropped.2,
            status,
        },
    )
}

pub(crate) fn request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    let scope = option::of(("[a-z]{0,8}", "[0-9.]{0,5}", attributes()).prop_map(
        |(name, version, attributes)| InstrumentationScope {
            name,
            version,
            attributes,
            dropped_attributes_count: 0,
        },
    ));
    let scope_spans =
        (scope, vec(span(), 0..5), "[a-z:/]{0,10}").prop_map(|(scope, spans, schema_url)| {
            ScopeSpans {
                scope,
                spans,
                schema_url,
            }
        });
    let resource = option::of(attributes().prop_map(|attributes| Resource {
        attributes,
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    }));
    let resource_spans = (resource, vec(scope_spans, 0..3), "[a-z]{0,4}").prop_map(
        |(resource, scope_spans, schema_url)| ResourceSpans {
            resource,
            scope_spans,
            schema_url,
        },
    );
    vec(resource_spans, 0..3)
        .prop_map(|resource_spans| ExportTraceServiceRequest { resource_spans })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn encoding_is_prost_s(request in request()) {
        let model =
            hermes_span::collector::trace::v1::ExportTraceServiceRequest::from(request.clone());
        let ours = encode_request(&model);
        prop_assert_eq!(ours.len(), Lengths::of(&model).total);
        prop_assert_eq!(ours, request.encode_to_vec());
        // Spans measured one by one per scope, as the batcher does.
        let mut per_scope = Vec::new();
        for (rs, theirs) in model.resource_spans.iter().zip(&request.resource_spans) {
            for (ss, theirs) in rs.scope_spans.iter().zip(&theirs.scope_spans) {
                let mut measured = MeasuredSpans::default();
                for (span, theirs) in ss.spans.iter().zip(&theirs.spans) {
                    prop_assert_eq!(
                        measured.push(span),
                        prost::encoding::message::encoded_len(2, theirs)
                    );
                }
                per_scope.push(measured);
            }
        }
        let lengths = Lengths::with_spans(&model, per_scope);
        prop_assert_eq!(lengths.encode(&model), request.encode_to_vec());
    }
}
