//! Batch assembly: size-bounded, merged by resource and scope.
//!
//! This module owns [`Batcher`], a pure accumulator (no clock, no I/O; the
//! stage decides when a batch is old enough). Invariants:
//! * a batch holds at most `max_spans` spans and about `max_bytes` encoded
//!   bytes (kept under the 4 MiB message limit of common OTLP/gRPC
//!   backends); an incoming message that does not fit is split at span
//!   granularity, so no span is ever dropped here (a single span larger than
//!   `max_bytes` travels alone);
//! * `ResourceSpans` with an equal `Resource` and resource `schema_url` are
//!   merged into one, and within it `ScopeSpans` with an equal scope and scope
//!   `schema_url` are merged into one; span order is preserved;
//! * scopes and resources without spans are dropped (nothing to export).
//!
//! Spans may also arrive encoded ([`Outgoing::Encoded`]): the correlation
//! stage runs an [`Encoder`] (which splits as this batcher does) when every sink sends
//! protobuf, so spans are built, encoded and freed on one thread and the
//! exporter stage handles bytes (`docs/ARCHITECTURE.md`, "Spans encoded
//! where they are built"). Encoded requests are joined by concatenation,
//! which protobuf defines as merging their repeated `resource_spans`:
//! within the same limits, but each keeps its own resource and scope
//! (equal ones are not merged across them).

use bytes::Bytes;
use hermes_span::collector::trace::v1::ExportTraceServiceRequest;
use hermes_span::common::v1::InstrumentationScope;
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span};

use crate::encode::{self, Lengths, MeasuredSpans};
use crate::sink::ExportBatch;

/// Accumulates spans into batches of at most `max_spans`.
#[derive(Debug)]
pub(crate) struct Batcher {
    max_spans: usize,
    max_bytes: usize,
    current: Vec<ResourceSpans>,
    /// The measure of every `ScopeSpans` of `current`, in the same shape:
    /// the encoder of the finished batch reuses it.
    measured: Vec<Vec<MeasuredSpans>>,
    spans: usize,
    /// Encoded size of the current batch, approximately (spans plus the
    /// resources and scopes they bring).
    bytes: usize,
    /// The current batch when its spans came encoded: requests to join.
    encoded: Vec<Bytes>,
}

/// What the correlation stage hands the exporter stage.
#[derive(Debug)]
pub enum Outgoing {
    /// Spans as built, for sinks that read them (file, console, ATIF).
    Spans(Vec<ResourceSpans>),
    /// Spans encoded where they were built ([`Encoder`]).
    Encoded(Vec<Encoded>),
}

impl Outgoing {
    /// Number of spans.
    pub fn span_count(&self) -> u64 {
        match self {
            Self::Spans(spans) => crate::sink::span_count(spans),
            Self::Encoded(chunks) => chunks.iter().map(|c| c.spans).sum(),
        }
    }

    /// The spans, when they were not encoded.
    pub fn into_spans(self) -> Option<Vec<ResourceSpans>> {
        match self {
            Self::Spans(spans) => Some(spans),
            Self::Encoded(_) => None,
        }
    }
}

impl From<Vec<ResourceSpans>> for Outgoing {
    fn from(spans: Vec<ResourceSpans>) -> Self {
        Self::Spans(spans)
    }
}

/// The protobuf bytes of one OTLP `ExportTraceServiceRequest`, within the
/// exporter's batch limits, and how many spans it holds.
#[derive(Debug, Clone)]
pub struct Encoded {
    bytes: Bytes,
    spans: u64,
}

impl Encoded {
    /// The request's protobuf bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// Encodes spans into requests within the exporter's batch limits, on the
/// caller's thread: the structured spans are freed there.
#[derive(Debug, Clone, Copy)]
pub struct Encoder {
    max_spans: usize,
    max_bytes: usize,
}

impl Encoder {
    pub(crate) fn new(max_spans: usize, max_bytes: usize) -> Self {
        Self {
            max_spans,
            max_bytes,
        }
    }

    /// `spans` encoded as one request when it is within the limits, else
    /// merged by resource and scope and split at the limits, as the
    /// exporter's batcher does, each part encoded.
    pub fn encode(&self, spans: Vec<ResourceSpans>) -> Outgoing {
        let count = crate::sink::span_count(&spans);
        if count == 0 {
            return Outgoing::Encoded(Vec::new());
        }
        let request = ExportTraceServiceRequest {
            resource_spans: spans,
        };
        if usize::try_from(count).is_ok_and(|count| count <= self.max_spans) {
            let lengths = Lengths::of(&request);
            if lengths.total() <= self.max_bytes {
                let bytes = Bytes::from(lengths.encode(&request));
                return Outgoing::Encoded(vec![Encoded {
                    bytes,
                    spans: count,
                }]);
            }
        }
        let mut batcher = Batcher::new(self.max_spans, self.max_bytes);
        let mut full = batcher.push(request.resource_spans);
        full.extend(batcher.take());
        Outgoing::Encoded(
            full.into_iter()
                .map(|batch| Encoded {
                    spans: batch.span_count(),
                    bytes: batch.protobuf().clone(),
                })
                .collect(),
        )
    }
}

/// Protobuf framing per repeated message (tag and length), upper bound.
const FRAMING: usize = 6;

impl Batcher {
    pub(crate) fn new(max_spans: usize, max_bytes: usize) -> Self {
        Self {
            max_spans: max_spans.max(1),
            max_bytes: max_bytes.max(1),
            current: Vec::new(),
            measured: Vec::new(),
            spans: 0,
            bytes: 0,
            encoded: Vec::new(),
        }
    }

    /// True when no span is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.spans == 0
    }

    /// Adds spans; returns the batches that became full, oldest first.
    pub(crate) fn push(&mut self, incoming: Vec<ResourceSpans>) -> Vec<ExportBatch> {
        let mut full = Vec::new();
        if !self.encoded.is_empty() {
            full.extend(self.take());
        }
        for rs in incoming {
            let ResourceSpans {
                resource,
                scope_spans,
                schema_url,
            } = rs;
            for ss in scope_spans {
                let ScopeSpans {
                    scope,
                    mut spans,
                    schema_url: scope_schema_url,
                } = ss;
                let mut chunk = Vec::new();
                let mut measured = MeasuredSpans::default();
                let mut chunk_bytes = 0;
                for span in spans.drain(..) {
                    let mark = measured.mark();
                    let size = measured.push(&span);
                    let over_count = self.spans + chunk.len() >= self.max_spans;
                    let over_bytes = self.bytes + chunk_bytes + size > self.max_bytes;
                    if (over_count || over_bytes) && self.spans + chunk.len() > 0 {
                        let this_span = measured.split_last(mark, size);
                        let done = std::mem::take(&mut chunk);
                        let done_measured = std::mem::replace(&mut measured, this_span);
                        self.add(
                            &resource,
                            &schema_url,
                            &scope,
                            &scope_schema_url,
                            (done, done_measured),
                            chunk_bytes,
                        );
                        chunk_bytes = 0;
                        if let Some(batch) = self.take() {
                            full.push(batch);
                        }
                    }
                    chunk_bytes += size;
                    chunk.push(span);
                }
                if !chunk.is_empty() {
                    self.add(
                        &resource,
                        &schema_url,
                        &scope,
                        &scope_schema_url,
                        (chunk, measured),
                        chunk_bytes,
                    );
                }
                if self.spans >= self.max_spans
                    && let Some(batch) = self.take()
                {
                    full.push(batch);
                }
            }
        }
        full
    }

    /// Adds encoded requests, joining them up to the limits (a request
    /// is never split: the [`Encoder`] kept it within them); returns the
    /// batches that became full, oldest first.
    pub(crate) fn push_encoded(&mut self, incoming: Vec<Encoded>) -> Vec<ExportBatch> {
        let mut full = Vec::new();
        if !self.current.is_empty() {
            full.extend(self.take());
        }
        for Encoded { bytes, spans } in incoming {
            let spans = usize::try_from(spans).unwrap_or(usize::MAX);
            let over = self.spans.saturating_add(spans) > self.max_spans
                || self.bytes + bytes.len() > self.max_bytes;
            if over && self.spans > 0 {
                full.extend(self.take());
            }
            self.spans = self.spans.saturating_add(spans);
            self.bytes += bytes.len();
            self.encoded.push(bytes);
            if self.spans >= self.max_spans {
                full.extend(self.take());
            }
        }
        full
    }

    /// Takes the current batch, if it holds any span.
    pub(crate) fn take(&mut self) -> Option<ExportBatch> {
        if self.spans == 0 {
            return None;
        }
        let spans = std::mem::take(&mut self.spans);
        self.bytes = 0;
        if !self.encoded.is_empty() {
            let parts = std::mem::take(&mut self.encoded);
            return Some(ExportBatch::encoded_parts(parts, spans as u64));
        }
        let request = ExportTraceServiceRequest {
            resource_spans: std::mem::take(&mut self.current),
        };
        let measured = std::mem::take(&mut self.measured).into_iter().flatten();
        let lengths = Lengths::with_spans(&request, measured);
        Some(ExportBatch::with_lengths(request, Some(lengths)))
    }

    fn add(
        &mut self,
        resource: &Option<Resource>,
        schema_url: &str,
        scope: &Option<InstrumentationScope>,
        scope_schema_url: &str,
        (spans, measured): (Vec<Span>, MeasuredSpans),
        bytes: usize,
    ) {
        self.spans += spans.len();
        self.bytes += bytes;
        let rs_index = match self
            .current
            .iter()
            .position(|rs| rs.resource == *resource && rs.schema_url == schema_url)
        {
            Some(i) => i,
            None => {
                self.bytes += resource.as_ref().map_or(0, encode::resource_len) + FRAMING;
                self.current.push(ResourceSpans {
                    resource: resource.clone(),
                    scope_spans: Vec::new(),
                    schema_url: schema_url.to_owned(),
                });
                self.measured.push(Vec::new());
                self.current.len() - 1
            }
        };
        let scopes = &mut self.current[rs_index].scope_spans;
        let scopes_measured = &mut self.measured[rs_index];
        match scopes
            .iter()
            .position(|ss| ss.scope == *scope && ss.schema_url == scope_schema_url)
        {
            Some(i) => {
                scopes[i].spans.extend(spans);
                scopes_measured[i].append(measured);
            }
            None => {
                self.bytes += scope.as_ref().map_or(0, encode::scope_len) + FRAMING;
                scopes.push(ScopeSpans {
                    scope: scope.clone(),
                    spans,
                    schema_url: scope_schema_url.to_owned(),
                });
                scopes_measured.push(measured);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_span::common::v1::{AnyValue, KeyValue, any_value};

    fn resource(service: &str) -> Option<Resource> {
        Some(Resource {
            attributes: vec![KeyValue {
                key: "service.name".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(service.into())),
                }),
            }],
            ..Default::default()
        })
    }

    fn scope(name: &str) -> Option<InstrumentationScope> {
        Some(InstrumentationScope {
            name: name.into(),
            ..Default::default()
        })
    }

    fn rs(service: &str, scope_name: &str, ids: &[u8]) -> ResourceSpans {
        ResourceSpans {
            resource: resource(service),
            scope_spans: vec![ScopeSpans {
                scope: scope(scope_name),
                spans: ids
                    .iter()
                    .map(|&i| Span {
                        span_id: [i; 8].into(),
                        ..Default::default()
                    })
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }
    }

    fn ids(batch: &ExportBatch) -> Vec<Vec<u8>> {
        batch
            .request()
            .resource_spans
            .iter()
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter())
            .map(|s| vec![s.span_id[0]])
            .collect()
    }

    #[test]
    fn merges_equal_resources_and_scopes() {
        let mut b = Batcher::new(100, usize::MAX);
        assert!(
            b.push(vec![rs("a", "s", &[1]), rs("b", "s", &[2])])
                .is_empty()
        );
        assert!(
            b.push(vec![rs("a", "s", &[3]), rs("a", "t", &[4])])
                .is_empty()
        );
        let batch = b.take().expect("a batch");
        let batch = &batch.request().resource_spans;
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].resource, resource("a"));
        assert_eq!(batch[0].scope_spans.len(), 2);
        assert_eq!(batch[0].scope_spans[0].spans.len(), 2);
        assert_eq!(batch[0].scope_spans[1].scope, scope("t"));
        assert_eq!(batch[1].resource, resource("b"));
        assert!(b.is_empty());
        assert!(b.take().is_none());
    }

    #[test]
    fn splits_at_max_spans_without_loss() {
        let mut b = Batcher::new(3, usize::MAX);
        let full = b.push(vec![rs("a", "s", &[1, 2, 3, 4, 5, 6, 7])]);
        assert_eq!(full.len(), 2);
        assert_eq!(ids(&full[0]), vec![vec![1], vec![2], vec![3]]);
        assert_eq!(ids(&full[1]), vec![vec![4], vec![5], vec![6]]);
        let rest = b.take().expect("a batch");
        assert_eq!(ids(&rest), vec![vec![7]]);
    }

    /// The spans of `spans` (one resource and scope), encoded.
    fn encoded(encoder: &Encoder, spans: ResourceSpans) -> Vec<Encoded> {
        match encoder.encode(vec![spans]) {
            Outgoing::Encoded(requests) => requests,
            Outgoing::Spans(_) => panic!("the encoder encodes"),
        }
    }

    #[test]
    fn encoded_requests_are_joined_and_kept_apart_from_spans() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest as Theirs;
        use prost::Message;
        let encoder = Encoder::new(3, usize::MAX);
        let mut b = Batcher::new(3, usize::MAX);
        assert!(
            b.push_encoded(encoded(&encoder, rs("a", "s", &[1])))
                .is_empty()
        );
        assert!(
            b.push_encoded(encoded(&encoder, rs("b", "s", &[2])))
                .is_empty()
        );
        // Spans as they are close the encoded batch, which holds both
        // requests: one request, each resource as it came.
        let joined = b.push(vec![rs("a", "s", &[3])]);
        assert_eq!(joined.len(), 1);
        assert_eq!(joined[0].span_count(), 2);
        assert!(joined[0].request().resource_spans.is_empty());
        let decoded = Theirs::decode(joined[0].protobuf().as_ref()).unwrap();
        let span_ids: Vec<_> = decoded
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .map(|span| span.span_id.clone())
            .collect();
        assert_eq!(span_ids, vec![vec![1; 8], vec![2; 8]]);
        assert_eq!(decoded.resource_spans.len(), 2);
        // And encoded requests close a batch of spans as they are.
        let spans = b.push_encoded(encoded(&encoder, rs("c", "s", &[4])));
        assert_eq!(ids(&spans[0]), vec![vec![3]]);
        assert_eq!(b.take().map(|batch| batch.span_count()), Some(1));
    }

    #[test]
    fn a_full_encoded_batch_goes_at_once() {
        let encoder = Encoder::new(2, usize::MAX);
        let mut b = Batcher::new(2, usize::MAX);
        assert!(
            b.push_encoded(encoded(&encoder, rs("a", "s", &[1])))
                .is_empty()
        );
        let full = b.push_encoded(encoded(&encoder, rs("a", "s", &[2, 3, 4])));
        // 1 alone (1 + 2 is over), then 2 and 3; 4 waits.
        let counts: Vec<u64> = full.iter().map(ExportBatch::span_count).collect();
        assert_eq!(counts, vec![1, 2]);
        assert_eq!(b.take().map(|batch| batch.span_count()), Some(1));
    }

    #[test]
    fn drops_empty_scopes() {
        let mut b = Batcher::new(3, usize::MAX);
        assert!(b.push(vec![rs("a", "s", &[])]).is_empty());
        assert!(b.is_empty());
        assert!(b.take().is_none());
    }
}

#[cfg(test)]
mod byte_limit_tests {
    use super::*;

    fn big_span(i: u8, bytes: usize) -> Span {
        Span {
            span_id: [i; 8].into(),
            name: "x".repeat(bytes).into(),
            ..Default::default()
        }
    }

    /// Every batch `spans` (of one resource and scope) make, the partial
    /// last one included.
    fn push_all(b: &mut Batcher, spans: Vec<Span>) -> Vec<ExportBatch> {
        let mut full = b.push(vec![ResourceSpans {
            resource: None,
            scope_spans: vec![ScopeSpans {
                scope: None,
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }]);
        full.extend(b.take());
        full
    }

    #[test]
    fn batches_stay_under_the_byte_limit() {
        let mut b = Batcher::new(1000, 10_000);
        let spans: Vec<Span> = (0..10).map(|i| big_span(i, 3000)).collect();
        let full = push_all(&mut b, spans);
        let sizes: Vec<usize> = full.iter().map(|batch| batch.protobuf().len()).collect();
        assert!(sizes.iter().all(|s| *s <= 10_000), "{sizes:?}");
        let count: u64 = full.iter().map(ExportBatch::span_count).sum();
        assert_eq!(count, 10, "no span dropped");
        assert_eq!(full.len(), 4, "3 spans of ~3 KB per 10 KB batch: {sizes:?}");
    }

    #[test]
    fn a_span_above_the_limit_travels_alone() {
        let mut b = Batcher::new(1000, 100);
        let spans = vec![big_span(1, 500), big_span(2, 10)];
        let full = push_all(&mut b, spans);
        assert_eq!(full.len(), 2);
    }
}

#[cfg(test)]
mod generated {
    //! Random streams of spans through the batcher: every batch encodes
    //! with the lengths the batcher measured exactly as prost encodes it.
    use super::Batcher;
    use crate::encode::generated::request;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use prost::Message;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn batches_encode_as_prost(
            messages in vec(request(), 1..5),
            max_spans in 1usize..8,
            max_bytes in prop_oneof![Just(usize::MAX), 200usize..5_000],
        ) {
            let mut batcher = Batcher::new(max_spans, max_bytes);
            let mut batches = Vec::new();
            let mut pushed = 0;
            for message in &messages {
                let model = hermes_span::collector::trace::v1::ExportTraceServiceRequest::from(
                    message.clone(),
                );
                pushed += crate::sink::span_count(&model.resource_spans);
                batches.extend(batcher.push(model.resource_spans));
            }
            batches.extend(batcher.take());
            let mut exported = 0;
            for batch in &batches {
                let theirs =
                    opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::from(
                        batch.request(),
                    );
                prop_assert_eq!(batch.protobuf().to_vec(), theirs.encode_to_vec());
                prop_assert!(batch.span_count() as usize <= max_spans);
                exported += batch.span_count();
            }
            prop_assert_eq!(exported, pushed);
        }

        /// Spans encoded by the [`Encoder`] and joined by the batcher
        /// arrive whole, each once, in batches within the limits.
        #[test]
        fn encoded_batches_hold_every_span_within_the_limits(
            messages in vec(request(), 1..5),
            max_spans in 1usize..8,
            max_bytes in prop_oneof![Just(usize::MAX), 200usize..5_000],
        ) {
            use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest as Theirs;
            let spans_of = |request: &Theirs| {
                request.resource_spans.iter()
                    .flat_map(|rs| &rs.scope_spans)
                    .flat_map(|ss| &ss.spans)
                    .map(Message::encode_to_vec)
                    .collect::<Vec<_>>()
            };
            let encoder = super::Encoder::new(max_spans, max_bytes);
            let mut batcher = Batcher::new(max_spans, max_bytes);
            let (mut sent, mut largest, mut batches) = (Vec::new(), 0, Vec::new());
            for message in &messages {
                let model = hermes_span::collector::trace::v1::ExportTraceServiceRequest::from(
                    message.clone(),
                );
                sent.extend(spans_of(&Theirs::from(&model)));
                let super::Outgoing::Encoded(requests) = encoder.encode(model.resource_spans) else {
                    panic!("the encoder encodes");
                };
                largest = requests.iter().map(|r| r.bytes.len()).fold(largest, usize::max);
                batches.extend(batcher.push_encoded(requests));
            }
            batches.extend(batcher.take());
            let mut exported = Vec::new();
            for batch in &batches {
                let theirs = Theirs::decode(batch.protobuf().as_ref()).unwrap();
                let spans = spans_of(&theirs);
                prop_assert_eq!(spans.len() as u64, batch.span_count());
                prop_assert!(spans.len() <= max_spans);
                prop_assert!(batch.protobuf().len() <= max_bytes.max(largest));
                exported.extend(spans);
            }
            sent.sort();
            exported.sort();
            prop_assert_eq!(exported, sent);
        }
    }
}
