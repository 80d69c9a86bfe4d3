//! In-test OTLP trace receivers that record every span they get.
//!
//! - [`OtlpReceiver`]: OTLP/gRPC, the real generated
//!   `TraceServiceServer` from `opentelemetry-proto`, accepting gzip and zstd
//!   compressed requests.
//! - [`OtlpHttpReceiver`]: OTLP/HTTP, `POST /v1/traces` with
//!   `application/x-protobuf` (or `application/json`) bodies, optionally
//!   `Content-Encoding: gzip`.
//!
//! Both listen on 127.0.0.1 (port 0 unless asked otherwise), over TLS when
//! started with [`ServerTls`] (`start_tls`), run on their own thread
//! ([`crate::server`]), stop on drop, and record into a [`SpanStore`]: every
//! export request with its transport details and headers, and every span
//! with its resource. [`SpanStore::fail_next`] and [`SpanStore::script`]
//! script rejections for the next requests (gRPC `UNAVAILABLE`, HTTP 503, or
//! any [`Rejection`]) to test retries; [`SpanStore::fail_for`] rejects
//! everything during a time window and [`SpanStore::fail_always`] for good,
//! keeping the rejected requests ([`SpanStore::rejected_exports`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::sync::Notify;
use tonic::codec::CompressionEncoding;

use crate::server::{Listening, ServerTls, header_text, http_error, http_response, read_post};
use crate::span_tree::SpanTree;

/// Largest request either receiver accepts (decompressed).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// One export request as received.
#[derive(Clone, Debug)]
pub struct ReceivedExport {
    /// `"grpc"` or `"http"`.
    pub transport: &'static str,
    /// `grpc-encoding` (gRPC) or `Content-Encoding` (HTTP), if any.
    pub encoding: Option<String>,
    /// `content-type` of the request.
    pub content_type: Option<String>,
    /// `user-agent` of the request.
    pub user_agent: Option<String>,
    /// Every header (HTTP) or metadata entry (gRPC) of the request.
    pub headers: HeaderMap,
    /// When it was received.
    pub received_at: Instant,
    /// The decoded request.
    pub request: ExportTraceServiceRequest,
}

/// A span with where it came from.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// The resource of its `ResourceSpans` (default if absent).
    pub resource: Resource,
    /// The instrumentation scope of its `ScopeSpans`.
    pub scope: Option<InstrumentationScope>,
    /// The span.
    pub span: Span,
}

/// How a scripted rejection answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Retryable: gRPC `UNAVAILABLE`, HTTP 503.
    Unavailable,
    /// Permanent: gRPC `INVALID_ARGUMENT`, HTTP 400.
    InvalidArgument,
    /// Retryable server fault: gRPC `INTERNAL`, HTTP 500.
    Internal,
    /// Throttled, retry after that many seconds: gRPC `RESOURCE_EXHAUSTED`,
    /// HTTP 429 with `Retry-After`.
    Throttled { retry_after_secs: u32 },
}

impl Rejection {
    fn grpc_status(self) -> tonic::Status {
        match self {
            Rejection::Unavailable => tonic::Status::unavailable("hermes-e2e: scripted failure"),
            Rejection::InvalidArgument => {
                tonic::Status::invalid_argument("hermes-e2e: scripted permanent failure")
            }
            Rejection::Internal => tonic::Status::internal("hermes-e2e: scripted server fault"),
            Rejection::Throttled { .. } => {
                tonic::Status::resource_exhausted("hermes-e2e: scripted throttling")
            }
        }
    }

    fn http_response(self) -> Response<Full<Bytes>> {
        let (status, message) = match self {
            Rejection::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "hermes-e2e: scripted failure",
            ),
            Rejection::InvalidArgument => (
                StatusCode::BAD_REQUEST,
                "hermes-e2e: scripted permanent failure",
            ),
            Rejection::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "hermes-e2e: scripted server fault",
            ),
            Rejection::Throttled { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "hermes-e2e: scripted throttling",
            ),
        };
        let mut response = http_error(status, message);
        if let Rejection::Throttled { retry_after_secs } = self {
            response
                .headers_mut()
                .insert(hyper::header::RETRY_AFTER, retry_after_secs.into());
        }
        response
    }
}

#[derive(Default)]
struct StoreState {
    exports: Vec<ReceivedExport>,
    spans: Vec<ReceivedSpan>,
    /// The answers to the next requests, in order.
    script: VecDeque<Rejection>,
    rejected: u32,
    /// Reject everything until then.
    fail_until: Option<(Instant, Rejection)>,
    /// Reject everything.
    fail_always: Option<Rejection>,
    /// The requests rejected by `fail_until`/`fail_always`.
    rejected_exports: Vec<ReceivedExport>,
}

/// What a receiver recorded; shared between the server thread and the test.
#[derive(Clone, Default)]
pub struct SpanStore {
    inner: Arc<(Mutex<StoreState>, Condvar)>,
    /// Wakes async waiters ([`SpanStore::until_spans`]) on every export.
    arrived: Arc<Notify>,
}

impl SpanStore {
    fn lock(&self) -> MutexGuard<'_, StoreState> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an export (unless a scripted failure is pending: then returns
    /// the rejection and records nothing, except the rejected request for
    /// the window and permanent rejections).
    fn record(&self, export: ReceivedExport) -> Result<(), Rejection> {
        let mut state = self.lock();
        if let Some(rejection) = state.script.pop_front() {
            state.rejected += 1;
            drop(state);
            self.notify();
            return Err(rejection);
        }
        let window = state
            .fail_until
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, rejection)| rejection);
        if let Some(rejection) = window.or(state.fail_always) {
            state.rejected += 1;
            state.rejected_exports.push(export);
            drop(state);
            self.notify();
            return Err(rejection);
        }
        for rs in &export.request.resource_spans {
            let resource = rs.resource.clone().unwrap_or_default();
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    state.spans.push(ReceivedSpan {
                        resource: resource.clone(),
                        scope: ss.scope.clone(),
                        span: span.clone(),
                    });
                }
            }
        }
        state.exports.push(export);
        drop(state);
        self.notify();
        Ok(())
    }

    fn notify(&self) {
        self.inner.1.notify_all();
        self.arrived.notify_waiters();
    }

    /// Every span received so far, with its resource, in arrival order.
    pub fn spans(&self) -> Vec<(Resource, Span)> {
        self.lock()
            .spans
            .iter()
            .map(|s| (s.resource.clone(), s.span.clone()))
            .collect()
    }

    /// Every span received so far, with resource and scope.
    pub fn received_spans(&self) -> Vec<ReceivedSpan> {
        self.lock().spans.clone()
    }

    /// Number of spans received so far.
    pub fn span_count(&self) -> usize {
        self.lock().spans.len()
    }

    /// Every accepted export request, in arrival order.
    pub fn exports(&self) -> Vec<ReceivedExport> {
        self.lock().exports.clone()
    }

    /// How many requests were rejected so far.
    pub fn rejected(&self) -> u32 {
        self.lock().rejected
    }

    /// Rejects the next `n` export requests (gRPC `UNAVAILABLE`, HTTP 503),
    /// recording nothing from them; replaces any script.
    pub fn fail_next(&self, n: u32) {
        let mut state = self.lock();
        state.script.clear();
        state.script.extend((0..n).map(|_| Rejection::Unavailable));
    }

    /// Answers the next requests with `rejections`, one each in order,
    /// recording nothing from them; then accepts again.
    pub fn script(&self, rejections: impl IntoIterator<Item = Rejection>) {
        self.lock().script.extend(rejections);
    }

    /// Rejects every export request for `duration` from now, with
    /// `rejection`, recording nothing from them but the rejected requests
    /// ([`rejected_exports`](Self::rejected_exports)); then accepts again.
    pub fn fail_for(&self, duration: Duration, rejection: Rejection) {
        self.lock().fail_until = Some((Instant::now() + duration, rejection));
    }

    /// When a [`fail_for`](Self::fail_for) window ends (None: no window).
    pub fn fail_until(&self) -> Option<Instant> {
        self.lock().fail_until.map(|(until, _)| until)
    }

    /// Rejects every export request from now on with `rejection` (None:
    /// accept again), recording only the rejected requests.
    pub fn fail_always(&self, rejection: Option<Rejection>) {
        self.lock().fail_always = rejection;
    }

    /// The requests rejected by [`fail_for`](Self::fail_for) or
    /// [`fail_always`](Self::fail_always), in arrival order.
    pub fn rejected_exports(&self) -> Vec<ReceivedExport> {
        self.lock().rejected_exports.clone()
    }

    /// Forgets everything received so far.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.exports.clear();
        state.spans.clear();
        state.rejected = 0;
        state.rejected_exports.clear();
    }

    /// A [`SpanTree`] of the spans received so far.
    pub fn tree(&self) -> SpanTree {
        SpanTree::new(self.spans())
    }

    /// Waits at most `timeout` until `pred` holds for the spans received so
    /// far; returns whether it did. Wakes on every export (and at least every
    /// 100 ms).
    pub fn wait_for(
        &self,
        mut pred: impl FnMut(&[(Resource, Span)]) -> bool,
        timeout: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            let snapshot: Vec<(Resource, Span)> = state
                .spans
                .iter()
                .map(|s| (s.resource.clone(), s.span.clone()))
                .collect();
            drop(state);
            if pred(&snapshot) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self.lock();
            let wait = (deadline - now).min(Duration::from_millis(100));
            state = match self.inner.1.wait_timeout(state, wait) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Waits at most `timeout` until at least `n` spans arrived.
    pub fn wait_for_spans(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for(|spans| spans.len() >= n, timeout)
    }

    /// Waits at most `timeout` until a span named `name` arrived.
    pub fn wait_for_span_named(&self, name: &str, timeout: Duration) -> bool {
        self.wait_for(|spans| spans.iter().any(|(_, s)| s.name == name), timeout)
    }

    /// [`wait_for_spans`](Self::wait_for_spans) for async tests whose
    /// runtime must keep running (the exporter under test is one of its
    /// tasks): yields instead of blocking the thread.
    pub async fn until_spans(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.arrived.notified();
            if self.span_count() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.span_count() >= n;
            }
        }
    }
}

/// The gRPC trace service: records and answers.
struct GrpcTraceService {
    store: SpanStore,
}

#[tonic::async_trait]
impl TraceService for GrpcTraceService {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request.metadata().clone().into_headers();
        let export = ReceivedExport {
            transport: "grpc",
            encoding: header_text(&headers, "grpc-encoding"),
            content_type: header_text(&headers, "content-type"),
            user_agent: header_text(&headers, "user-agent"),
            headers,
            received_at: Instant::now(),
            request: request.into_inner(),
        };
        match self.store.record(export) {
            Ok(()) => Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            })),
            Err(rejection) => Err(rejection.grpc_status()),
        }
    }
}

/// An OTLP/gRPC trace receiver on 127.0.0.1; stops on drop.
pub struct OtlpReceiver {
    server: Listening,
    store: SpanStore,
}

impl OtlpReceiver {
    /// Starts on an OS-chosen port.
    pub fn start() -> OtlpReceiver {
        Self::start_on(0)
    }

    /// Starts on `port` (0: OS-chosen), e.g. to bring a receiver back on
    /// the port of one that was stopped.
    pub fn start_on(port: u16) -> OtlpReceiver {
        Self::start_with_store(port, SpanStore::default())
    }

    /// Starts on `port`, recording into an existing `store` (so spans
    /// survive a receiver restart).
    pub fn start_with_store(port: u16, store: SpanStore) -> OtlpReceiver {
        Self::start_grpc(port, store, None)
    }

    /// Starts over TLS with `tls` (its endpoint is `https://`) on an
    /// OS-chosen port.
    pub fn start_tls(tls: &ServerTls) -> OtlpReceiver {
        Self::start_grpc(0, SpanStore::default(), Some(tls))
    }

    fn start_grpc(port: u16, store: SpanStore, tls: Option<&ServerTls>) -> OtlpReceiver {
        let service = TraceServiceServer::new(GrpcTraceService {
            store: store.clone(),
        })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(MAX_REQUEST_BYTES);
        let server = Listening::grpc("otlp-grpc-receiver", port, tls, move |builder, incoming| {
            builder.serve_with_incoming(service, incoming)
        });
        OtlpReceiver { server, store }
    }

    /// `http://127.0.0.1:PORT` (`https://` over TLS): the OTLP/gRPC
    /// endpoint, or the OTLP/HTTP base URL.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The store the receiver records into.
    pub fn store(&self) -> &SpanStore {
        &self.store
    }

    /// Every span received so far, with its resource.
    pub fn spans(&self) -> Vec<(Resource, Span)> {
        self.store.spans()
    }

    /// Waits at most `timeout` until `pred` holds for the received spans.
    pub fn wait_for(
        &self,
        pred: impl FnMut(&[(Resource, Span)]) -> bool,
        timeout: Duration,
    ) -> bool {
        self.store.wait_for(pred, timeout)
    }

    /// Stops the receiver (same as dropping it).
    pub fn stop(self) {}
}

/// An OTLP/HTTP trace receiver (`POST /v1/traces`) on 127.0.0.1; stops on
/// drop. Everything but starting and [`traces_url`](Self::traces_url) is
/// the same as [`OtlpReceiver`]'s.
pub struct OtlpHttpReceiver(OtlpReceiver);

impl Deref for OtlpHttpReceiver {
    type Target = OtlpReceiver;

    fn deref(&self) -> &OtlpReceiver {
        &self.0
    }
}

impl OtlpHttpReceiver {
    /// Starts on an OS-chosen port.
    pub fn start() -> OtlpHttpReceiver {
        Self::start_on(0)
    }

    /// Starts on `port` (0: OS-chosen).
    pub fn start_on(port: u16) -> OtlpHttpReceiver {
        Self::start_with_store(port, SpanStore::default())
    }

    /// Starts on `port`, recording into an existing `store`.
    pub fn start_with_store(port: u16, store: SpanStore) -> OtlpHttpReceiver {
        Self::start_http(port, store, None)
    }

    /// Starts over TLS (HTTP/1.1 over TLS, `https://`) with `tls` on an
    /// OS-chosen port.
    pub fn start_tls(tls: &ServerTls) -> OtlpHttpReceiver {
        Self::start_http(0, SpanStore::default(), Some(tls))
    }

    fn start_http(port: u16, store: SpanStore, tls: Option<&ServerTls>) -> OtlpHttpReceiver {
        let server_store = store.clone();
        let server = Listening::http("otlp-http-receiver", port, tls, move |req| {
            handle_http(server_store.clone(), req)
        });
        OtlpHttpReceiver(OtlpReceiver { server, store })
    }

    /// The receiver as an [`OtlpReceiver`] (everything but
    /// [`traces_url`](Self::traces_url)), for code that runs either.
    pub fn into_inner(self) -> OtlpReceiver {
        self.0
    }

    /// The endpoint with `/v1/traces`.
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint())
    }

    /// Stops the receiver (same as dropping it).
    pub fn stop(self) {}
}

async fn handle_http(
    store: SpanStore,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (headers, body) = match read_post(req, "/v1/traces", MAX_REQUEST_BYTES).await {
        Ok(read) => read,
        Err(refused) => return Ok(refused),
    };
    let content_type = header_text(&headers, hyper::header::CONTENT_TYPE);
    let json = content_type
        .as_deref()
        .is_some_and(|ct| ct.trim().starts_with("application/json"));
    let request = if json {
        serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
    } else {
        ExportTraceServiceRequest::decode(&body[..]).map_err(|e| e.to_string())
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => return Ok(http_error(StatusCode::BAD_REQUEST, &format!("decode: {e}"))),
    };
    let export = ReceivedExport {
        transport: "http",
        encoding: header_text(&headers, hyper::header::CONTENT_ENCODING),
        content_type,
        user_agent: header_text(&headers, hyper::header::USER_AGENT),
        headers,
        received_at: Instant::now(),
        request,
    };
    if let Err(rejection) = store.record(export) {
        return Ok(rejection.http_response());
    }
    let response = ExportTraceServiceResponse {
        partial_success: None,
    };
    Ok(if json {
        http_response(StatusCode::OK, "application/json", b"{}".to_vec())
    } else {
        http_response(
            StatusCode::OK,
            "application/x-protobuf",
            response.encode_to_vec(),
        )
    })
}
