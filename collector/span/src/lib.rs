//! The collector's in-memory OTLP trace model.
//!
//! The same messages, fields and module paths as `opentelemetry_proto`'s
//! (`hermes_span::trace::v1::Span` for `opentelemetry_proto::tonic::trace::v1::Span`),
//! with two differences: attribute keys, string values and span and event
//! names are a [`Str`], which is static (no allocation: every key the
//! correlator writes), shared (cloned by a reference count: the ids, model
//! and platform every span of a turn repeats) or owned; and trace and span
//! ids are an [`Id`], held in place rather than allocated. The correlator builds
//! spans in this model, the processor rewrites them in place, the exporters
//! encode them to OTLP's protobuf bytes directly (`hermes_exporter::encode`)
//! or render them (the console tree), and what needs prost's messages (the
//! JSON file exporter's OTLP JSON, tests) converts them with `From` (both
//! ways: [`convert`]).
//!
//! Left as in `opentelemetry_proto`: `Status` (one per span, often absent)
//! and the `SpanKind` and `StatusCode` enums, re-exported; `trace_state` and
//! `schema_url` stay `String` (always empty in the collector's spans, so
//! never allocated).
//!
//! Fields the collector never sets are left out: `KeyValue::key_strindex`,
//! `Resource::entity_refs` and the `string_value_strindex` value (OTLP
//! additions for profiles and entities; converted from prost's messages they
//! are dropped).
//!
//! One field is added: `Span::shared`, the turn's leading attributes held
//! once for all its spans ([`SharedAttributes`]), which the processor and
//! the OTLP encoder use to do their per-attribute work once per turn. It
//! is a cache: the span's `attributes` hold those attributes too, spans
//! compare equal whatever it holds, and converting to prost's messages
//! drops it.

mod block;
pub mod convert;
mod id;
mod str;

pub use crate::block::SharedAttributes;
pub use crate::id::Id;
pub use crate::str::Str;

pub mod common {
    pub mod v1 {
        use crate::Str;

        /// `opentelemetry.proto.common.v1.AnyValue`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct AnyValue {
            pub value: Option<any_value::Value>,
        }

        pub mod any_value {
            use super::{ArrayValue, KeyValueList};
            use crate::Str;

            /// The oneof of `AnyValue`.
            #[derive(Clone, Debug, PartialEq)]
            pub enum Value {
                StringValue(Str),
                BoolValue(bool),
                IntValue(i64),
                DoubleValue(f64),
                ArrayValue(ArrayValue),
                KvlistValue(KeyValueList),
                BytesValue(Vec<u8>),
            }
        }

        /// `opentelemetry.proto.common.v1.ArrayValue`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct ArrayValue {
            pub values: Vec<AnyValue>,
        }

        /// `opentelemetry.proto.common.v1.KeyValueList`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct KeyValueList {
            pub values: Vec<KeyValue>,
        }

        /// `opentelemetry.proto.common.v1.KeyValue`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct KeyValue {
            pub key: Str,
            pub value: Option<AnyValue>,
        }

        /// `opentelemetry.proto.common.v1.InstrumentationScope`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct InstrumentationScope {
            pub name: Str,
            pub version: Str,
            pub attributes: Vec<KeyValue>,
            pub dropped_attributes_count: u32,
        }
    }
}

pub mod resource {
    pub mod v1 {
        use crate::common::v1::KeyValue;

        /// `opentelemetry.proto.resource.v1.Resource`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct Resource {
            pub attributes: Vec<KeyValue>,
            pub dropped_attributes_count: u32,
        }
    }
}

pub mod trace {
    pub mod v1 {
        use crate::common::v1::{InstrumentationScope, KeyValue};
        use crate::resource::v1::Resource;
        use crate::{Id, SharedAttributes, Str};

        pub use opentelemetry_proto::tonic::trace::v1::{Status, status};

        /// `opentelemetry.proto.trace.v1.ResourceSpans`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct ResourceSpans {
            pub resource: Option<Resource>,
            pub scope_spans: Vec<ScopeSpans>,
            pub schema_url: String,
        }

        /// `opentelemetry.proto.trace.v1.ScopeSpans`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct ScopeSpans {
            pub scope: Option<InstrumentationScope>,
            pub spans: Vec<Span>,
            pub schema_url: String,
        }

        /// `opentelemetry.proto.trace.v1.Span`.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct Span {
            pub trace_id: Id,
            pub span_id: Id,
            pub trace_state: String,
            pub parent_span_id: Id,
            pub flags: u32,
            pub name: Str,
            pub kind: i32,
            pub start_time_unix_nano: u64,
            pub end_time_unix_nano: u64,
            pub attributes: Vec<KeyValue>,
            pub dropped_attributes_count: u32,
            pub events: Vec<span::Event>,
            pub dropped_events_count: u32,
            pub links: Vec<span::Link>,
            pub dropped_links_count: u32,
            pub status: Option<Status>,
            /// The turn's attributes that lead `attributes`, held once for
            /// all its spans (not an OTLP field: a cache that never changes
            /// what the span holds).
            pub shared: SharedAttributes,
        }

        pub mod span {
            use crate::common::v1::KeyValue;
            use crate::{Id, Str};

            pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

            /// `opentelemetry.proto.trace.v1.Span.Event`.
            #[derive(Clone, Debug, Default, PartialEq)]
            pub struct Event {
                pub time_unix_nano: u64,
                pub name: Str,
                pub attributes: Vec<KeyValue>,
                pub dropped_attributes_count: u32,
            }

            /// `opentelemetry.proto.trace.v1.Span.Link`.
            #[derive(Clone, Debug, Default, PartialEq)]
            pub struct Link {
                pub trace_id: Id,
                pub span_id: Id,
                pub trace_state: String,
                pub attributes: Vec<KeyValue>,
                pub dropped_attributes_count: u32,
                pub flags: u32,
            }
        }
    }
}

pub mod collector {
    pub mod trace {
        pub mod v1 {
            use crate::trace::v1::ResourceSpans;

            /// `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`.
            #[derive(Clone, Debug, Default, PartialEq)]
            pub struct ExportTraceServiceRequest {
                pub resource_spans: Vec<ResourceSpans>,
            }
        }
    }
}
