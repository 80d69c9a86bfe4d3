//! The sink abstraction: one named destination of exported batches.
//!
//! This module owns the [`SpanExporter`] trait that every exporter implements
//! (OTLP gRPC, OTLP HTTP, file, console, and test doubles), [`Sink`], the
//! named, boxed exporter the stage ([`crate::stage`]) drives, and
//! [`ExportBatch`], the batch every sink of the stage is handed.
//!
//! Contract of an exporter: `export` is called with one batch at a time (the
//! stage never overlaps two calls on the same exporter), it bounds its own
//! duration (request timeout) and it reports failure as an [`ExportError`]
//! whose [`ExportError::retry_class`] tells whether the same batch may be sent
//! again. An exporter never retries by itself: retrying is the stage's job.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use hermes_span::collector::trace::v1::ExportTraceServiceRequest;
use hermes_span::trace::v1::ResourceSpans;

use crate::encode::Lengths;
use crate::error::ExportError;

/// The future an exporter returns (boxed so [`SpanExporter`] is object safe).
pub type ExportFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ExportOutcome, ExportError>> + Send + 'a>>;

/// What a successful export reports back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportOutcome {
    /// Spans the receiver accepted the request for but rejected (OTLP
    /// partial success). They are counted as failed and never retried.
    pub rejected_spans: u64,
}

/// A destination for batches of finished spans.
pub trait SpanExporter: Send + 'static {
    /// Exports one batch. The batch is shared between sinks and kept for
    /// retries: clone what must be owned.
    fn export(&mut self, batch: Arc<ExportBatch>) -> ExportFuture<'_>;

    /// Where this exporter sends spans, for the startup log: protocol and
    /// URL or file, never credentials (see [`shown_endpoint`]).
    fn destination(&self) -> String;

    /// True when this exporter reads only the batch's protobuf bytes
    /// ([`ExportBatch::protobuf`], [`ExportBatch::protobuf_parts`]), never
    /// [`ExportBatch::request`]: when every sink does, the correlation stage
    /// encodes spans where it builds them ([`crate::Encoder`]).
    fn takes_encoded(&self) -> bool {
        false
    }

    /// Called once, after the last `export`, when the stage shuts down
    /// cleanly. Exporters that buffer (the console tree) flush here.
    fn shutdown(&mut self) -> ExportFuture<'_> {
        Box::pin(async { Ok(ExportOutcome::default()) })
    }
}

/// A named exporter. The name labels logs and [`crate::stage::SinkStats`]; it
/// should be short and stable (`otlp_grpc`, `file`, …), never per request.
pub struct Sink {
    name: String,
    exporter: Box<dyn SpanExporter>,
}

impl Sink {
    /// Wraps an exporter under a name.
    pub fn new(name: impl Into<String>, exporter: impl SpanExporter) -> Self {
        Self {
            name: name.into(),
            exporter: Box::new(exporter),
        }
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the sink's exporter sends spans ([`SpanExporter::destination`]).
    pub fn destination(&self) -> String {
        self.exporter.destination()
    }

    /// See [`SpanExporter::takes_encoded`].
    pub fn takes_encoded(&self) -> bool {
        self.exporter.takes_encoded()
    }

    pub(crate) fn exporter_mut(&mut self) -> &mut dyn SpanExporter {
        self.exporter.as_mut()
    }
}

/// `endpoint` as logs and errors may show it: scheme, host, port and path.
/// Userinfo (`user:password@`) becomes `***@`; the query and the fragment,
/// where tokens travel, are left out.
pub fn shown_endpoint(endpoint: &str) -> String {
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, endpoint),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = match authority.rfind('@') {
        Some(at) => format!("***@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    }
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").field("name", &self.name).finish()
    }
}

/// One batch of spans, as the stage hands it to every sink: an OTLP request
/// and, made on first use and kept, its protobuf encoding, so OTLP sinks
/// share one encoding and retries do not encode again.
///
/// A batch from the stage's batcher carries the lengths the batcher measured
/// while sizing it, and its encoding is the second pass only
/// ([`crate::encode`]).
#[derive(Debug)]
pub struct ExportBatch {
    request: ExportTraceServiceRequest,
    spans: u64,
    /// The batcher's measure of `request`, taken by the first encoding.
    lengths: Mutex<Option<Lengths>>,
    /// Encoded requests whose concatenation is the batch's request, as
    /// they came (a sink that sends them in one piece need not join them).
    parts: Vec<Bytes>,
    protobuf: OnceLock<Bytes>,
}

impl ExportBatch {
    /// A batch of `request`, measured when it is first encoded.
    pub fn new(request: ExportTraceServiceRequest) -> Self {
        Self::with_lengths(request, None)
    }

    /// A batch of `request` with its lengths measured beforehand.
    pub(crate) fn with_lengths(
        request: ExportTraceServiceRequest,
        lengths: Option<Lengths>,
    ) -> Self {
        let spans = span_count(&request.resource_spans);
        Self {
            request,
            spans,
            lengths: Mutex::new(lengths),
            parts: Vec::new(),
            protobuf: OnceLock::new(),
        }
    }

    /// A batch that came as encoded requests, whose concatenation is one
    /// request (protobuf merges the repeated `resource_spans`); its
    /// [`Self::request`] is empty (only sinks that take encoded batches get
    /// one).
    pub(crate) fn encoded_parts(parts: Vec<Bytes>, spans: u64) -> Self {
        Self {
            request: ExportTraceServiceRequest::default(),
            spans,
            lengths: Mutex::new(None),
            parts,
            protobuf: OnceLock::new(),
        }
    }

    /// The spans (none for a batch that came encoded).
    pub fn request(&self) -> &ExportTraceServiceRequest {
        &self.request
    }

    /// Number of spans.
    pub fn span_count(&self) -> u64 {
        self.spans
    }

    /// The request's protobuf bytes (OTLP `ExportTraceServiceRequest`),
    /// encoded (or joined) by the first caller.
    pub fn protobuf(&self) -> &Bytes {
        self.protobuf.get_or_init(|| match self.parts.as_slice() {
            [] => {
                let measured = self.lengths.lock().ok().and_then(|mut l| l.take());
                let lengths = measured.unwrap_or_else(|| Lengths::of(&self.request));
                Bytes::from(lengths.encode(&self.request))
            }
            [one] => one.clone(),
            parts => Bytes::from(parts.concat()),
        })
    }

    /// The request's protobuf bytes in pieces to send one after another:
    /// the encoded requests as they came, without joining them.
    pub fn protobuf_parts(&self) -> Vec<Bytes> {
        if self.parts.is_empty() {
            vec![self.protobuf().clone()]
        } else {
            self.parts.clone()
        }
    }
}

/// Number of spans in `resource_spans`.
pub(crate) fn span_count(resource_spans: &[ResourceSpans]) -> u64 {
    resource_spans
        .iter()
        .flat_map(|rs| rs.scope_spans.iter())
        .map(|ss| ss.spans.len() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::shown_endpoint;

    #[test]
    fn a_shown_endpoint_keeps_the_place_and_drops_credentials() {
        for (endpoint, shown) in [
            (
                "http://127.0.0.1:4318/v1/traces",
                "http://127.0.0.1:4318/v1/traces",
            ),
            ("https://user:s3cret@h:443/otlp", "https://***@h:443/otlp"),
            (
                "https://h/v1/traces?api_key=s3cret#x",
                "https://h/v1/traces",
            ),
            ("https://a@b@h", "https://***@h"),
            ("h:4317", "h:4317"),
            ("user:s3cret@h:4317/p?q", "***@h:4317/p"),
            ("", ""),
        ] {
            assert_eq!(shown_endpoint(endpoint), shown, "{endpoint}");
        }
    }
}
