//! Shared test fixtures: span builders, an in-process OTLP/gRPC receiver, a
//! scriptable OTLP/HTTP receiver, an in-memory writer and a scripted sink.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hermes_exporter::{ExportError, ExportFuture, ExportOutcome, SpanExporter};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::codec::CompressionEncoding;

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

// ---------------------------------------------------------------- gRPC

/// One request as the gRPC receiver saw it.
#[derive(Debug, Clone)]
pub struct GrpcCall {
    pub request: ExportTraceServiceRequest,
    pub encoding: Option<String>,
    pub metadata: tonic::metadata::MetadataMap,
}

#[derive(Clone, Default)]
struct GrpcRecorder {
    calls: Arc<Mutex<Vec<GrpcCall>>>,
    notify: Arc<Notify>,
}

#[tonic::async_trait]
impl TraceService for GrpcRecorder {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        let encoding = metadata
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.calls.lock().unwrap().push(GrpcCall {
            request: request.into_inner(),
            encoding,
            metadata,
        });
        self.notify.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver on 127.0.0.1:0 that records every request. It
/// accepts gzip-compressed requests.
pub struct GrpcReceiver {
    pub endpoint: String,
    recorder: GrpcRecorder,
}

impl GrpcReceiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let recorder = GrpcRecorder::default();
        let service = TraceServiceServer::new(recorder.clone())
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(16 * 1024 * 1024);
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(async move {
            // One service, no router (tonic's `router` feature is off).
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming(service, incoming)
                .await;
        });
        Self {
            endpoint: format!("http://{addr}"),
            recorder,
        }
    }

    pub fn calls(&self) -> Vec<GrpcCall> {
        self.recorder.calls.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) until at least `n` spans arrived.
    pub async fn wait_for_spans(&self, n: usize) -> Vec<GrpcCall> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let notified = self.recorder.notify.notified();
            let calls = self.calls();
            let requests: Vec<_> = calls.iter().map(|c| c.request.clone()).collect();
            if all_spans(&requests).len() >= n {
                return calls;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "timed out waiting for {n} spans; got {}",
                    all_spans(&requests).len()
                );
            }
        }
    }
}

// ---------------------------------------------------------------- HTTP

/// One request as the HTTP receiver saw it.
#[derive(Debug, Clone)]
pub struct HttpCall {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub headers: http::HeaderMap,
    /// The decoded body, when it decoded.
    pub request: Option<ExportTraceServiceRequest>,
    /// The status the receiver answered.
    pub answered: u16,
}

/// A scripted answer: status and extra headers.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, &'static str)>,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
        }
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1:0. It answers from the script in order,
/// then 200 with an empty `ExportTraceServiceResponse`.
pub struct HttpReceiver {
    pub endpoint: String,
    calls: Arc<Mutex<Vec<HttpCall>>>,
}

impl HttpReceiver {
    pub async fn start(script: Vec<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let state = (Arc::clone(&calls), script);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (calls, script) = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<Incoming>| {
                        let calls = Arc::clone(&calls);
                        let script = Arc::clone(&script);
                        async move { Ok::<_, Infallible>(handle(req, &calls, &script).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            endpoint: format!("http://{addr}"),
            calls,
        }
    }

    pub fn calls(&self) -> Vec<HttpCall> {
        self.calls.lock().unwrap().clone()
    }
}

async fn handle(
    req: http::Request<Incoming>,
    calls: &Mutex<Vec<HttpCall>>,
    script: &Mutex<VecDeque<Answer>>,
) -> http::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let answer = script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(Answer::status(200));
    calls.lock().unwrap().push(HttpCall {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        headers: parts.headers.clone(),
        request: ExportTraceServiceRequest::decode(body).ok(),
        answered: answer.status,
    });
    let body = if answer.status == 200 {
        ExportTraceServiceResponse::default().encode_to_vec()
    } else {
        b"scripted failure".to_vec()
    };
    let mut response = http::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = http::StatusCode::from_u16(answer.status).unwrap();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    for (name, value) in answer.headers {
        response
            .headers_mut()
            .insert(name, http::HeaderValue::from_static(value));
    }
    response
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
