//! Shared test fixtures: span builders, an in-memory writer and a scripted
//! sink. The OTLP receivers are the workspace's (`hermes_e2e`).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hermes_exporter::{ExportError, ExportFuture, ExportOutcome, SpanExporter};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

/// How long a test waits for spans to arrive at a receiver.
pub const WAIT: Duration = Duration::from_secs(10);

pub const TRACE: [u8; 16] = [
    0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36,
];
pub const TRACE_HEX: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// 2025-01-01T00:00:00Z in ns.
pub const T0: u64 = 1_735_689_600_000_000_000;
pub const MS: u64 = 1_000_000;

pub fn kv_str(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

pub fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

pub fn span_id(n: u8) -> Vec<u8> {
    vec![0, 0, 0, 0, 0, 0, 0, n]
}

/// A span of trace `trace`, id `id`, under `parent`, from `T0 + start_ms` to
/// `T0 + end_ms`.
pub fn span(
    trace: [u8; 16],
    id: u8,
    parent: Option<u8>,
    name: &str,
    start_ms: f64,
    end_ms: f64,
    attributes: Vec<KeyValue>,
) -> Span {
    Span {
        trace_id: trace.to_vec(),
        span_id: span_id(id),
        parent_span_id: parent.map(span_id).unwrap_or_default(),
        name: name.into(),
        kind: 1,
        start_time_unix_nano: T0 + ms_to_ns(start_ms),
        end_time_unix_nano: T0 + ms_to_ns(end_ms),
        attributes,
        ..Default::default()
    }
}

/// The sample turn's root, `invoke_agent hermes` (span 1 of [`TRACE`],
/// 0 to 1500 ms), with `attributes`.
pub fn turn_root(attributes: Vec<KeyValue>) -> Span {
    span(
        TRACE,
        1,
        None,
        "invoke_agent hermes",
        0.0,
        1500.0,
        attributes,
    )
}

/// The sample turn's model call, `chat gpt-4o` (span 2, under the root,
/// 10 to 822.3 ms), with `attributes`.
pub fn turn_chat(attributes: Vec<KeyValue>) -> Span {
    span(TRACE, 2, Some(1), "chat gpt-4o", 10.0, 822.3, attributes)
}

/// Milliseconds (µs precision) to nanoseconds, without float truncation.
fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64 * 1000
}

pub fn error_status(message: &str) -> Option<Status> {
    Some(Status {
        message: message.into(),
        code: 2,
    })
}

pub fn resource() -> Resource {
    Resource {
        attributes: vec![
            kv_str("service.name", "hermes-agent"),
            kv_int("process.pid", 4242),
        ],
        ..Default::default()
    }
}

/// One ResourceSpans (test resource, scope `hermes-collector`) of `spans`.
pub fn resource_spans(spans: Vec<Span>) -> Vec<ResourceSpans> {
    vec![ResourceSpans {
        resource: Some(resource()),
        scope_spans: vec![ScopeSpans {
            scope: Some(InstrumentationScope {
                name: "hermes-collector".into(),
                version: "0.1.0".into(),
                ..Default::default()
            }),
            spans,
            schema_url: String::new(),
        }],
        schema_url: String::new(),
    }]
}

/// The same, in the collector's span model, as the exporters take it.
pub fn ours(spans: Vec<Span>) -> Vec<hermes_span::trace::v1::ResourceSpans> {
    hermes_span::convert::from_otlp(resource_spans(spans))
}

pub fn request(spans: Vec<Span>) -> Arc<hermes_exporter::ExportBatch> {
    Arc::new(hermes_exporter::ExportBatch::new(
        hermes_span::collector::trace::v1::ExportTraceServiceRequest {
            resource_spans: ours(spans),
        },
    ))
}

/// `n` leaf spans of trace `TRACE`, ids `first..first+n`.
pub fn leaf_spans(first: u8, n: u8) -> Vec<Span> {
    (first..first + n)
        .map(|i| span(TRACE, i, Some(1), &format!("span {i}"), 1.0, 2.0, vec![]))
        .collect()
}

pub fn all_spans(requests: &[ExportTraceServiceRequest]) -> Vec<Span> {
    requests
        .iter()
        .flat_map(|r| r.resource_spans.iter())
        .flat_map(|rs| rs.scope_spans.iter())
        .flat_map(|ss| ss.spans.iter().cloned())
        .collect()
}

// ---------------------------------------------------------------- writers and sinks

/// A `Write` into shared memory, for the console exporter.
#[derive(Clone, Default)]
pub struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a scripted sink does on one export call.
pub enum Step {
    Ok,
    Fail(ExportError),
    /// Never completes.
    Hang,
}

/// One export call: when (paused clock) and what.
pub type Call = (tokio::time::Instant, Arc<hermes_exporter::ExportBatch>);

/// A sink that records calls (with the paused-clock instant) and answers
/// from a script, then `Ok`.
#[derive(Clone, Default)]
pub struct ScriptedSink {
    pub calls: Arc<Mutex<Vec<Call>>>,
    script: Arc<Mutex<VecDeque<Step>>>,
    pub shutdowns: Arc<Mutex<u32>>,
}

impl ScriptedSink {
    pub fn new(script: Vec<Step>) -> Self {
        Self {
            script: Arc::new(Mutex::new(script.into())),
            ..Self::default()
        }
    }

    pub fn requests(&self) -> Vec<ExportTraceServiceRequest> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, r)| ExportTraceServiceRequest::from(r.request()))
            .collect()
    }
}

impl SpanExporter for ScriptedSink {
    fn destination(&self) -> String {
        "a scripted test sink".to_owned()
    }

    fn export(&mut self, request: Arc<hermes_exporter::ExportBatch>) -> ExportFuture<'_> {
        self.calls
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), request));
        let step = self.script.lock().unwrap().pop_front().unwrap_or(Step::Ok);
        Box::pin(async move {
            match step {
                Step::Ok => Ok(ExportOutcome::default()),
                Step::Fail(e) => Err(e),
                Step::Hang => std::future::pending().await,
            }
        })
    }

    fn shutdown(&mut self) -> ExportFuture<'_> {
        *self.shutdowns.lock().unwrap() += 1;
        Box::pin(async { Ok(ExportOutcome::default()) })
    }
}
