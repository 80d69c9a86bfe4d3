//! In-test OTLP trace receivers that record every span they get.
//!
//! - [`OtlpReceiver`]: OTLP/gRPC, the real generated
//!   `TraceServiceServer` from `opentelemetry-proto`, accepting gzip and zstd
//!   compressed requests.
//! - [`OtlpHttpReceiver`]: OTLP/HTTP, `POST /v1/traces` with
//!   `application/x-protobuf` (or `application/json`) bodies, optionally
//!   `Content-Encoding: gzip`.
//!
//! Both listen on 127.0.0.1 (port 0 unless asked otherwise), run on their own
//! thread with their own single-threaded tokio runtime (so they work the same
//! from plain `#[test]`s and from `#[tokio::test]`s), stop on drop, and
//! record into a [`SpanStore`]: every export request with its transport
//! details, and every span with its resource. [`SpanStore::fail_next`]
//! scripts rejections (gRPC `UNAVAILABLE`, HTTP 503) to test retries;
//! [`SpanStore::fail_for`] rejects everything during a time window and
//! [`SpanStore::fail_always`] for good, with a [`Rejection`] of either class
//! (retryable, or permanent: gRPC `INVALID_ARGUMENT`, HTTP 400), keeping
//! the rejected requests ([`SpanStore::rejected_exports`]).

use std::convert::Infallible;
use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
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
use tokio::sync::oneshot;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;

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
}

#[derive(Default)]
struct StoreState {
    exports: Vec<ReceivedExport>,
    spans: Vec<ReceivedSpan>,
    fail_next: u32,
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
        if state.fail_next > 0 {
            state.fail_next -= 1;
            state.rejected += 1;
            drop(state);
            self.inner.1.notify_all();
            return Err(Rejection::Unavailable);
        }
        let window = state
            .fail_until
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, rejection)| rejection);
        if let Some(rejection) = window.or(state.fail_always) {
            state.rejected += 1;
            state.rejected_exports.push(export);
            drop(state);
            self.inner.1.notify_all();
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
        self.inner.1.notify_all();
        Ok(())
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

    /// How many requests were rejected by [`fail_next`](Self::fail_next).
    pub fn rejected(&self) -> u32 {
        self.lock().rejected
    }

    /// Rejects the next `n` export requests (gRPC `UNAVAILABLE`, HTTP 503),
    /// recording nothing from them.
    pub fn fail_next(&self, n: u32) {
        self.lock().fail_next = n;
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
}

/// The server thread of a receiver: stops (abruptly, dropping open
/// connections) and is joined on drop.
pub(crate) struct ServerThread {
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl ServerThread {
    pub(crate) fn spawn<F, Fut>(name: &str, listener: StdTcpListener, serve: F) -> ServerThread
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let (tx, rx) = oneshot::channel::<()>();
        let thread_name = name.to_string();
        let handle = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!("{thread_name}: cannot build tokio runtime: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("{thread_name}: cannot register listener: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = serve(listener) => {}
                        _ = rx => {}
                    }
                });
                // Dropping the runtime cancels the connection tasks.
            })
            .unwrap_or_else(|e| panic!("spawn {name} thread: {e}"));
        ServerThread {
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            // Bounded: the server future is dropped as soon as the signal
            // arrives, and runtime shutdown only cancels tasks.
            let _ = handle.join();
        }
    }
}

/// Binds 127.0.0.1:`port` (0: OS-chosen). A chosen port that was just
/// released is retried for up to 2 s: a child process that a parallel test
/// forked while the old listener was open holds a copy of it until its exec
/// closes it (the socket is close-on-exec), and binding in that window fails
/// with "address in use".
pub(crate) fn bind(port: u16) -> StdTcpListener {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let listener = loop {
        match StdTcpListener::bind(("127.0.0.1", port)) {
            Err(e)
                if port != 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            bound => break bound,
        }
    }
    .unwrap_or_else(|e| panic!("bind 127.0.0.1:{port}: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("set_nonblocking: {e}"));
    listener
}

pub(crate) fn local_addr(listener: &StdTcpListener) -> SocketAddr {
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"))
}

/// Serves gRPC on `listener` from a thread of its own: `serve` runs the
/// tonic server on the incoming connections.
pub(crate) fn serve_grpc<F, Fut>(
    name: &'static str,
    listener: StdTcpListener,
    serve: F,
) -> ServerThread
where
    F: FnOnce(TcpIncoming) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), tonic::transport::Error>>,
{
    ServerThread::spawn(name, listener, move |listener| async move {
        if let Err(e) = serve(TcpIncoming::from(listener)).await {
            eprintln!("{name}: {e}");
        }
    })
}

/// Serves HTTP/1.1 on `listener` from a thread of its own, answering each
/// request with `handle`; over TLS when `tls` is given.
pub(crate) fn serve_http1<H, Fut>(
    name: &'static str,
    listener: StdTcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handle: H,
) -> ServerThread
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    ServerThread::spawn(name, listener, move |listener| async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("{name}: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let handle = handle.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let served = match tls {
                    None => serve_connection(stream, handle).await,
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => serve_connection(stream, handle).await,
                        Err(e) => {
                            eprintln!("{name}: TLS handshake: {e}");
                            return;
                        }
                    },
                };
                if let Err(e) = served
                    && !e.is_incomplete_message()
                {
                    eprintln!("{name}: connection: {e}");
                }
            });
        }
    })
}

async fn serve_connection<S, H, Fut>(stream: S, handle: H) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service_fn(handle))
        .await
}

/// A TLS acceptor for HTTP/1.1 with `cert_pem`/`key_pem`, requiring a client
/// certificate from `client_ca_pem` if given.
pub(crate) fn tls_acceptor(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&str>,
) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("TLS versions: {e}"));
    let builder = match client_ca_pem {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots
                    .add(cert.unwrap_or_else(|e| panic!("client CA: {e}")))
                    .unwrap_or_else(|e| panic!("client CA: {e}"));
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap_or_else(|e| panic!("client verifier: {e}"));
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("server certificate: {e}"));
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .unwrap_or_else(|e| panic!("server key: {e}"));
    let mut config = builder
        .with_single_cert(chain, key)
        .unwrap_or_else(|e| panic!("server certificate and key: {e}"));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
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
        let meta = request.metadata();
        let header = |name: &str| {
            meta.get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        let export = ReceivedExport {
            transport: "grpc",
            encoding: header("grpc-encoding"),
            content_type: header("content-type"),
            user_agent: header("user-agent"),
            received_at: Instant::now(),
            request: request.into_inner(),
        };
        match self.store.record(export) {
            Ok(()) => Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            })),
            Err(Rejection::Unavailable) => {
                Err(tonic::Status::unavailable("hermes-e2e: scripted failure"))
            }
            Err(Rejection::InvalidArgument) => Err(tonic::Status::invalid_argument(
                "hermes-e2e: scripted permanent failure",
            )),
        }
    }
}

/// An OTLP/gRPC trace receiver on 127.0.0.1; stops on drop.
pub struct OtlpReceiver {
    addr: SocketAddr,
    store: SpanStore,
    _server: ServerThread,
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
        let listener = bind(port);
        let addr = local_addr(&listener);
        let service = TraceServiceServer::new(GrpcTraceService {
            store: store.clone(),
        })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(MAX_REQUEST_BYTES);
        let server = serve_grpc("otlp-grpc-receiver", listener, move |incoming| {
            tonic::transport::Server::builder().serve_with_incoming(service, incoming)
        });
        OtlpReceiver {
            addr,
            store,
            _server: server,
        }
    }

    /// `http://127.0.0.1:PORT`, the OTLP/gRPC endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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

/// An OTLP/HTTP trace receiver (`POST /v1/traces`) on 127.0.0.1; stops on drop.
pub struct OtlpHttpReceiver {
    addr: SocketAddr,
    store: SpanStore,
    _server: ServerThread,
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
        let listener = bind(port);
        let addr = local_addr(&listener);
        let server_store = store.clone();
        let server = serve_http1("otlp-http-receiver", listener, None, move |req| {
            handle_http(server_store.clone(), req)
        });
        OtlpHttpReceiver {
            addr,
            store,
            _server: server,
        }
    }

    /// `http://127.0.0.1:PORT` (the base; traces go to [`traces_url`](Self::traces_url)).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1/traces`.
    pub fn traces_url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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

pub(crate) fn http_response(
    status: StatusCode,
    content_type: &str,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn http_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    http_response(status, "text/plain", message.as_bytes().to_vec())
}

async fn handle_http(
    store: SpanStore,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/v1/traces" {
        return Ok(http_error(StatusCode::NOT_FOUND, "only /v1/traces"));
    }
    if req.method() != Method::POST {
        return Ok(http_error(StatusCode::METHOD_NOT_ALLOWED, "POST only"));
    }
    let header = |name: hyper::header::HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let content_type = header(hyper::header::CONTENT_TYPE);
    let encoding = header(hyper::header::CONTENT_ENCODING);
    let user_agent = header(hyper::header::USER_AGENT);
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(http_error(StatusCode::BAD_REQUEST, &format!("body: {e}"))),
    };
    let body: Vec<u8> = match encoding.as_deref().map(str::trim) {
        None | Some("") | Some("identity") => body.to_vec(),
        Some("gzip") => {
            let mut out = Vec::new();
            let decoder = flate2::read::GzDecoder::new(&body[..]);
            if let Err(e) = decoder
                .take(MAX_REQUEST_BYTES as u64 + 1)
                .read_to_end(&mut out)
            {
                return Ok(http_error(StatusCode::BAD_REQUEST, &format!("gzip: {e}")));
            }
            if out.len() > MAX_REQUEST_BYTES {
                return Ok(http_error(StatusCode::PAYLOAD_TOO_LARGE, "too large"));
            }
            out
        }
        Some(other) => {
            return Ok(http_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding {other}"),
            ));
        }
    };
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
        encoding,
        content_type,
        user_agent,
        received_at: Instant::now(),
        request,
    };
    match store.record(export) {
        Ok(()) => {}
        Err(Rejection::Unavailable) => {
            return Ok(http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "hermes-e2e: scripted failure",
            ));
        }
        Err(Rejection::InvalidArgument) => {
            return Ok(http_error(
                StatusCode::BAD_REQUEST,
                "hermes-e2e: scripted permanent failure",
            ));
        }
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
